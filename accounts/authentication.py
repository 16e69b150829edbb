"""API-key authentication for the REST API: `Authorization: Bearer cs_<prefix>_<secret>`."""

from __future__ import annotations

from django.http import HttpRequest
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from accounts.models import ApiKey, User
from accounts.services import api_key_authenticate
from chatsite.errors import INVALID_API_KEY, ClientError


class ApiKeyAuthentication(BaseAuthentication):
    """Sets request.user to the key's owner and request.auth to the ApiKey.

    A header that is not a Bearer `cs_` key is left to the other authenticators; a `cs_` key that is
    unknown, revoked or expired is refused outright, so a dead key never falls through to a session.
    """

    keyword = b"bearer"

    def authenticate(self, request: Request) -> tuple[User, ApiKey] | None:
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


def api_key_caller(request: HttpRequest, *, scope: str) -> tuple[User, ApiKey]:
    """The API key's owner and the key for a plain (non-DRF) view under /v1, or a ClientError:
    401 without a valid key (keys only: no cookies on /v1), 403 without `scope` or for a disabled
    account. The same refusals DRF's views give through ApiKeyAuthentication and HasScope."""
    drf_request = Request(request)
    try:
        result = ApiKeyAuthentication().authenticate(drf_request)
    except exceptions.AuthenticationFailed as exc:
        raise ClientError(str(exc.detail), code=INVALID_API_KEY, status=401) from None
    if result is None:
        raise ClientError(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            code=INVALID_API_KEY,
            status=401,
        )
    user, api_key = result
    if not api_key.has_scope(scope):
        raise ClientError(f"This API key does not have the '{scope}' scope.", code="insufficient_scope", status=403)
    if not user.is_active:
        raise ClientError("This account is disabled.", code="account_disabled", status=403)
    return user, api_key


class AuthenticatedHttpRequest(HttpRequest):
    """The request a page behind `login_required` is given, for the type checker: its user is signed in."""

    user: User


def request_user(request: Request) -> User:
    """The signed-in user of an API request that the view's authentication has let in."""
    user = request.user
    if not isinstance(user, User):
        raise exceptions.NotAuthenticated()
    return user


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Describes API-key authentication in the OpenAPI schema as a bearer token."""

    target_class = ApiKeyAuthentication
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API key: `Authorization: Bearer cs_...`."}


def signed_in(request: HttpRequest | Request) -> User:
    """The request's user, on a view that only a signed-in user reaches (`login_required`, a page's
    script endpoint, an API view's permission): typed as such for what the view calls."""
    user = request.user
    if not isinstance(user, User) or not user.is_authenticated:
        raise exceptions.NotAuthenticated()
    return user
