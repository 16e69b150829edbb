"""The chat socket's origin check: a socket is accepted only from the page's own origin.

A browser sends any page's cookies with a WebSocket it opens, whatever page opens it, and no CORS
rule stands in the way: the Origin header is the only thing that tells the service's own page from
another site's (cross-site WebSocket hijacking). The origin must match the one the socket was
opened on exactly — scheme, host and port, as the Host header and the socket's scheme (ws → http,
wss → https, or a trusted proxy's X-Forwarded-Proto: chatsite/proxies.py) give it — or be one
of WEBSOCKET_TRUSTED_ORIGINS; and the host must be one of ALLOWED_HOSTS, as for any page.
channels' AllowedHostsOriginValidator compared the origin's host alone, so a page on another port
or scheme of the same host (`http://127.0.0.1:9999`) could open the service's socket.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

from chatsite.proxies import peer_trusted, scope_peer

DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_allowed(scope: dict[str, Any]) -> bool:
    """Whether a WebSocket scope's Origin may open a socket on the host it was sent to."""
    headers = _headers(scope)
    host = headers.get("host", "")
    origin = _origin_parts(headers.get("origin", ""))
    if origin is None or not _host_allowed(host):
        return False
    page = _origin_parts(f"{_page_scheme(scope, headers)}://{host}")
    if page is not None and origin == page:
        return True
    return any(_matches(origin, trusted) for trusted in settings.WEBSOCKET_TRUSTED_ORIGINS)


class PageOriginValidator:
    """ASGI middleware: refuses a WebSocket whose origin `origin_allowed` does not accept."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("PageOriginValidator guards WebSocket connections only.")
        if origin_allowed(scope):
            return await self.application(scope, receive, send)
        # Imported here: settings import this module to check WEBSOCKET_TRUSTED_ORIGINS, before
        # channels' consumers can be imported.
        from channels.security.websocket import WebsocketDenier

        return await WebsocketDenier()(scope, receive, send)


def trusted_origin_valid(origin: str) -> bool:
    """Whether a WEBSOCKET_TRUSTED_ORIGINS entry is `scheme://host[:port]`, the host possibly `*.domain`."""
    return _trusted_parts(origin) is not None


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    # A repeated Origin or Host is ambiguous: the check then refuses (an empty value matches nothing).
    found: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        key = name.decode("latin1").lower()
        if key in ("origin", "host") and key in found:
            found[key] = ""
        else:
            found[key] = value.decode("latin1")
    return found


def _host_allowed(host: str) -> bool:
    domain, _ = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:  # Django's own rule for a page in that case
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _page_scheme(scope: dict[str, Any], headers: dict[str, str]) -> str:
    """The scheme of the page that opened the socket, as Django would see that page's request."""
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header and peer_trusted(scope_peer(scope)):
        name, secure_value = proxy_header
        forwarded = headers.get(name.removeprefix("HTTP_").replace("_", "-").lower())
        if forwarded is not None:
            return "https" if forwarded.split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") == "wss" else "http"


def _origin_parts(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a serialized origin, the port filled in; None for anything else."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if scheme not in DEFAULT_PORTS or not host or parts.username or parts.password:
        return None
    if parts.path or parts.query or parts.fragment:
        return None
    return scheme, host, port if port is not None else DEFAULT_PORTS[scheme]


def _trusted_parts(trusted: str) -> tuple[str, str, int, bool] | None:
    """(scheme, host, port, whether subdomains match too) of a trusted origin: `https://*.example.com`
    stands for example.com and its subdomains, as in CSRF_TRUSTED_ORIGINS."""
    wildcard = "://*." in trusted
    parts = _origin_parts(trusted.replace("://*.", "://wildcard.", 1) if wildcard else trusted)
    if parts is None:
        return None
    scheme, host, port = parts
    return scheme, ("." + host.removeprefix("wildcard.")) if wildcard else host, port, wildcard


def _matches(origin: tuple[str, str, int], trusted: str) -> bool:
    parts = _trusted_parts(trusted)
    if parts is None:
        return False
    scheme, host, port, wildcard = parts
    if origin[0] != scheme or origin[2] != port:
        return False
    return is_same_domain(origin[1], host) if wildcard else origin[1] == host
