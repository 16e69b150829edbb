"""The chat socket opens only from the page's own origin (scheme, host and port) or a trusted one."""

from __future__ import annotations

import pytest

from chatsite.origins import origin_allowed, trusted_origin_valid
from tests.helpers.sockets import open_socket


def scope(origin: str | None, host: str | None = "127.0.0.1:8000", scheme: str = "ws", **headers: str) -> dict:
    pairs = [(b"origin", origin.encode())] if origin is not None else []
    if host is not None:
        pairs.append((b"host", host.encode()))
    pairs += [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    return {"type": "websocket", "scheme": scheme, "headers": pairs}


@pytest.fixture(autouse=True)
def no_trusted_origins(settings):
    settings.WEBSOCKET_TRUSTED_ORIGINS = []
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "chat.example.com"]


@pytest.mark.parametrize(
    ("origin", "host", "scheme"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws"),
        ("https://chat.example.com", "chat.example.com", "wss"),
        ("https://chat.example.com:443", "chat.example.com", "wss"),
        ("http://localhost", "localhost:80", "ws"),
        ("HTTP://LocalHost", "localhost", "ws"),
    ],
)
def test_the_pages_own_origin_is_accepted(origin, host, scheme):
    assert origin_allowed(scope(origin, host, scheme))


@pytest.mark.parametrize(
    ("origin", "host", "scheme"),
    [
        ("http://127.0.0.1:9999", "127.0.0.1:8000", "ws"),  # another port of the same host
        ("https://127.0.0.1:8000", "127.0.0.1:8000", "ws"),  # another scheme
        ("http://chat.example.com", "chat.example.com", "wss"),  # an http page on an https site
        ("http://evil.example", "127.0.0.1:8000", "ws"),
        ("http://evil.example", "evil.example", "ws"),  # its own origin, but not an allowed host
        ("http://sub.chat.example.com", "chat.example.com", "ws"),
        ("null", "127.0.0.1:8000", "ws"),
        ("", "127.0.0.1:8000", "ws"),
        (None, "127.0.0.1:8000", "ws"),
        ("http://127.0.0.1:8000", None, "ws"),  # no Host: the page's origin is unknown
        ("http://127.0.0.1:8000/chat/", "127.0.0.1:8000", "ws"),
        ("http://user@127.0.0.1:8000", "127.0.0.1:8000", "ws"),
        ("ftp://127.0.0.1:8000", "127.0.0.1:8000", "ws"),
        ("http://127.0.0.1:99999", "127.0.0.1:99999", "ws"),
    ],
)
def test_any_other_origin_is_refused(origin, host, scheme):
    assert not origin_allowed(scope(origin, host, scheme))


def test_a_repeated_origin_header_is_refused():
    doubled = scope("http://127.0.0.1:8000")
    doubled["headers"].append((b"origin", b"http://127.0.0.1:8000"))
    assert not origin_allowed(doubled)


def test_behind_a_proxy_the_forwarded_scheme_is_the_pages(settings):
    settings.TRUSTED_PROXY, settings.TRUSTED_PROXIES = True, []  # DJANGO_BEHIND_PROXY
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert origin_allowed(scope("https://chat.example.com", "chat.example.com", "ws", x_forwarded_proto="https"))
    assert not origin_allowed(scope("http://chat.example.com", "chat.example.com", "ws", x_forwarded_proto="https"))
    assert origin_allowed(scope("http://chat.example.com", "chat.example.com", "ws", x_forwarded_proto="http"))
    assert origin_allowed(scope("http://chat.example.com", "chat.example.com", "ws"))


def test_the_forwarded_scheme_is_ignored_unless_behind_a_proxy(settings):
    settings.SECURE_PROXY_SSL_HEADER = None
    assert not origin_allowed(scope("https://chat.example.com", "chat.example.com", "ws", x_forwarded_proto="https"))


def test_a_trusted_origin_is_accepted_on_an_allowed_host(settings):
    settings.WEBSOCKET_TRUSTED_ORIGINS = ["https://app.example.org", "https://*.example.net:8443"]
    assert origin_allowed(scope("https://app.example.org", "chat.example.com"))
    assert origin_allowed(scope("https://eu.example.net:8443", "chat.example.com"))
    assert not origin_allowed(scope("https://eu.example.net", "chat.example.com"))  # another port
    assert not origin_allowed(scope("http://app.example.org", "chat.example.com"))  # another scheme
    assert not origin_allowed(scope("https://app.example.org.evil.example", "chat.example.com"))
    assert not origin_allowed(scope("https://app.example.org", "evil.example"))  # the host is not allowed


@pytest.mark.parametrize(
    ("origin", "valid"),
    [
        ("https://chat.example.com", True),
        ("https://*.example.com:8443", True),
        ("http://[::1]:8000", True),
        ("chat.example.com", False),
        ("https://chat.example.com/", False),
        ("*", False),
    ],
)
def test_a_trusted_origin_setting_must_be_an_origin(origin, valid):
    assert trusted_origin_valid(origin) is valid


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("origin", "host", "connected"),
    [
        ("http://localhost:8000", "localhost:8000", True),
        ("http://localhost:9999", "localhost:8000", False),
        ("https://localhost:8000", "localhost:8000", False),
        ("http://localhost:8000", "evil.example", False),
    ],
)
async def test_the_asgi_application_checks_the_origin_before_the_consumer(alice, origin, host, connected):
    _, opened = await open_socket(alice, origin=origin, host=host)
    assert opened is connected
