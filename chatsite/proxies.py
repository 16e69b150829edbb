"""Whose forwarded headers are believed, and the client's address behind a proxy.

A client can send `X-Forwarded-For` and `X-Forwarded-Proto` itself: believed from anyone, a rotating
`X-Forwarded-For` would make each request look like another client's (escaping every per-address
limit), and `X-Forwarded-Proto: https` a plain-HTTP request look secure. They are believed only from
a proxy the operator names:

- `DJANGO_TRUSTED_PROXIES` (addresses or networks): only a peer among them is a proxy, and the
  client is the first address of `X-Forwarded-For`, read from the right, that is not one of them
  (each proxy appends the peer it saw, so entries further left are whatever the client sent);
- `DJANGO_BEHIND_PROXY` alone: every peer is the proxy (the service is reachable only through it),
  and the client is the last entry its proxy appended.

Neither set (the default), the peer is the client and the headers are ignored. uvicorn's own
handling of these headers is turned off wherever the service is started (`--no-proxy-headers` in the
Makefile and the Procfile), since by default it believes them from loopback: this module is the one
place that decides.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

MAX_ADDRESS_CHARS = 64


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket's form of an IPv4 peer
    return address


def peer_trusted(peer: str) -> bool:
    """Whether the peer that connected is a proxy whose forwarded headers are believed."""
    if not settings.TRUSTED_PROXY:
        return False
    if not settings.TRUSTED_PROXIES:
        return True
    address = _ip(peer)
    return address is not None and any(address in network for network in settings.TRUSTED_PROXIES)


def client_address(*, peer: str, forwarded_for: str) -> str:
    """The client's address: the peer's, or behind a trusted proxy the one `X-Forwarded-For` names
    (read from the right, past the trusted proxies' own entries)."""
    entries = [entry.strip() for entry in forwarded_for.split(",") if entry.strip()]
    if not entries or not peer_trusted(peer):
        return peer[:MAX_ADDRESS_CHARS]
    if not settings.TRUSTED_PROXIES:
        return _written(entries[-1])
    for entry in reversed(entries):
        if not peer_trusted(entry):
            return _written(entry)
    return _written(entries[0])  # every entry one of our proxies: the leftmost is nearest the client


def _written(entry: str) -> str:
    address = _ip(entry)
    return (str(address) if address is not None else entry)[:MAX_ADDRESS_CHARS]


def request_forwarded_headers_resolve(request: HttpRequest) -> None:
    """Make `REMOTE_ADDR` the client's address (what every limit, log and check reads), and drop a
    scheme header a proxy did not send."""
    peer = request.META.get("REMOTE_ADDR", "")
    if peer_trusted(peer):
        request.META["REMOTE_ADDR"] = client_address(
            peer=peer, forwarded_for=request.META.get("HTTP_X_FORWARDED_FOR", "")
        )
    else:
        request.META.pop("HTTP_X_FORWARDED_PROTO", None)


@sync_and_async_middleware
def forwarded_headers_from_proxies_only(
    get_response: Callable[[HttpRequest], Any],
) -> Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]:
    """`request_forwarded_headers_resolve` before anything reads the request. Native in both modes."""
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponseBase:
            request_forwarded_headers_resolve(request)
            return await get_response(request)

        return middleware_async

    def middleware(request: HttpRequest) -> HttpResponseBase:
        request_forwarded_headers_resolve(request)
        return get_response(request)

    return middleware


def scope_peer(scope: dict[str, Any]) -> str:
    """The address of the peer that opened an ASGI connection ("" when the server gives none)."""
    client = scope.get("client")
    return str(client[0]) if client else ""
