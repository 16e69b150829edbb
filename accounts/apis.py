"""What the REST API's views share: who may call them and with which API key scope."""

from __future__ import annotations

from rest_framework.permissions import IsAuthenticated
from rest_framework.views import APIView

from accounts.authentication import HasScope


class ScopedApi(APIView):
    """A REST view for an API key or a session, where the scope a key needs depends on the HTTP
    method (`method_scopes`; a method not named there is closed to keys)."""

    permission_classes = [IsAuthenticated, HasScope]
    method_scopes: dict[str, str] = {}

    @property
    def required_scope(self) -> str | None:
        return self.method_scopes.get(self.request.method or "")
