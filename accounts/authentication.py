"""API-key authentication for the REST API: `Authorization: Bearer cs_<prefix>_<secret>`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission

from accounts.models import ApiKey
from accounts.services import api_key_authenticate


class ApiKeyAuthentication(BaseAuthentication):
    """Sets request.user to the key's owner and request.auth to the ApiKey.

    A header that is not a Bearer `cs_` key is left to the other authenticators; a `cs_` key that is
    unknown, revoked or expired is refused outright, so a dead key never falls through to a session.
    """

    keyword = b"bearer"

    def authenticate(self, request) -> tuple[Any, ApiKey] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Send the key as 'Authorization: Bearer <key>'.")
        try:
            raw = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The API key is invalid.") from None
        if not raw.startswith("cs_"):
            return None
        api_key = api_key_authenticate(key=raw)
        if api_key is None:
            raise exceptions.AuthenticationFailed("The API key is invalid, revoked or expired.")
        return api_key.user, api_key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class HasScope(BasePermission):
    """Requests made with an API key need the view's `required_scope`; session requests pass.

    Usage: `permission_classes = [IsAuthenticated, HasScope]` and `required_scope = "models:read"`.
    """

    message = "This API key does not have the scope this endpoint needs."

    def has_permission(self, request, view) -> bool:
        if not isinstance(request.auth, ApiKey):
            return True
        scope = getattr(view, "required_scope", None)
        if scope is None:
            return False  # a view that forgot to name its scope is closed to keys, not open
        return request.auth.has_scope(scope)


def require_scope(request, scope: str) -> None:
    """Raise PermissionDenied unless the request's key (if any) has `scope`; for function-style checks."""
    if isinstance(request.auth, ApiKey) and not request.auth.has_scope(scope):
        raise exceptions.PermissionDenied(f"This API key does not have the '{scope}' scope.")


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Describes API-key authentication in the OpenAPI schema as a bearer token."""

    target_class = ApiKeyAuthentication
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API key: `Authorization: Bearer cs_...`."}
