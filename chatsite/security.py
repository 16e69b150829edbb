"""Response headers that keep pages and answers to the people they belong to.

The Content-Security-Policy itself is django-csp's, configured in settings; this module adds what a
static setting cannot say (the socket's origin for the host a request came to) and keeps shared
caches from storing anything private.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import patch_cache_control, patch_vary_headers
from django.utils.decorators import sync_and_async_middleware


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's policy, with the chat socket's ws:// or wss:// origin added to connect-src.

    CSP3 browsers let 'self' cover a page's own host over ws(s), older ones do not; naming the origin
    keeps the chat working in both without allowing any other host.
    """

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request=request, response=response, report_only=report_only)
        try:
            host = request.get_host()
        except DisallowedHost:  # the response is the 400 for that host: no socket to allow
            return parts
        socket_origin = f"{'wss' if request.is_secure() else 'ws'}://{host}"
        update = dict(parts.update or {})
        update["connect-src"] = [*update.get("connect-src", []), socket_origin]
        parts.update = update
        return parts


def request_is_private(request: HttpRequest) -> bool:
    """Whether the answer may depend on who asks: a session cookie or an API key came with it.

    The cookie rather than the session's user: the user is looked up lazily, and in async code only
    by awaiting; a request that carries either may be answered with someone's own data.
    """
    return settings.SESSION_COOKIE_NAME in request.COOKIES or "HTTP_AUTHORIZATION" in request.META


def response_mark_private(*, request: HttpRequest, response: HttpResponseBase) -> None:
    if not request_is_private(request):
        return
    # no-store even where a view chose no-cache (the streams): no cache along the way may keep a copy.
    if "no-store" not in response.get("Cache-Control", ""):
        patch_cache_control(response, private=True, no_store=True)
    patch_vary_headers(response, ("Cookie", "Authorization"))


@sync_and_async_middleware
def private_responses_not_stored(
    get_response: Callable[[HttpRequest], Any],
) -> Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]:
    """Every response to a signed-in or API-key request gets `Cache-Control: private, no-store` and
    `Vary: Cookie, Authorization`, so no shared cache serves one person's conversation to another.

    Native in both modes: under ASGI it adds no hop to a thread."""
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponseBase:
            response = await get_response(request)
            response_mark_private(request=request, response=response)
            return response

        return middleware_async

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response = get_response(request)
        response_mark_private(request=request, response=response)
        return response

    return middleware
