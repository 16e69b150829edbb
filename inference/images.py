"""Images in a chat completion's messages (OpenAI `image_url` content parts): parsed at the edge,
fetched (where the operator allows addresses at all) under server-side request forgery rules, and
read (cleaned and OCR'd) by whatever the layer above registered (`inference.hooks`).

A data URL (`data:image/png;base64,...`) is decoded here. An http(s) URL is fetched only with
API_IMAGE_URLS on, and then: every address its host resolves to must be a public one (no private,
loopback, link-local, multicast or reserved address, IPv4 or IPv6), the connection goes to the address
that was checked (a second lookup cannot swap it), each redirect is checked the same way and at most
API_IMAGE_URL_REDIRECTS are followed, and no more than the plan's image size is read.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from django.conf import settings

from chatsite.errors import ClientError

_DATA_URL = re.compile(r"^data:(image/[a-z0-9.+-]+)?(;[a-z0-9=.+-]+)*;base64,", re.IGNORECASE)


@dataclass(frozen=True)
class ImageSource:
    """An image part as the client sent it: its bytes (a data URL's), or an address to fetch."""

    data: bytes | None = None
    url: str = ""


def image_part_parse(part: dict[str, Any]) -> ImageSource:
    """An `image_url` content part, checked: a base64 data URL, or an http(s) URL where allowed."""
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url:
        raise ClientError("An image_url part needs a 'url'.", code="invalid_value", param="messages")
    if isinstance(spec, dict) and spec.get("detail") not in (None, "auto", "low", "high"):
        raise ClientError("An image's 'detail' must be auto, low or high.", code="invalid_value", param="messages")
    match = _DATA_URL.match(url[:200])
    if match:
        try:
            return ImageSource(data=base64.b64decode(url[match.end() :], validate=True))
        except (binascii.Error, ValueError):
            raise ClientError(
                "An image's data URL is not valid base64.", code="invalid_value", param="messages"
            ) from None
    if url.startswith("data:"):
        raise ClientError(
            "An image's data URL must be base64 (data:image/png;base64,...).", code="invalid_value", param="messages"
        )
    if urlsplit(url).scheme not in ("http", "https"):
        raise ClientError(
            "An image's url must be a data URL or an http(s) address.", code="invalid_value", param="messages"
        )
    if not settings.API_IMAGE_URLS:
        raise ClientError(
            "Images must be sent inline as data URLs (data:image/png;base64,...): this service fetches no addresses.",
            code="image_url_not_allowed",
            param="messages",
        )
    return ImageSource(url=url)


def address_is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback or ip.is_link_local)


def _refused(url: str, why: str) -> ClientError:
    return ClientError(f"The image at {url[:200]} was not fetched: {why}.", code="image_url_refused", param="messages")


def image_fetch(url: str, *, max_bytes: int) -> bytes:
    """The bytes at an http(s) address, under the rules above; a 400 naming the rule it broke."""
    import urllib3

    for _ in range(settings.API_IMAGE_URL_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _refused(url, "only http(s) addresses are fetched")
        if parts.username or parts.password:
            raise _refused(url, "addresses with credentials are not fetched")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise _refused(url, "its host does not resolve") from None
        addresses = [str(info[4][0]) for info in found]
        if not addresses or not all(address_is_public(a) for a in addresses):
            raise _refused(url, "its host is a private, loopback or link-local address")
        address = str(addresses[0])
        timeout = urllib3.Timeout(total=settings.API_IMAGE_URL_TIMEOUT_S)
        pool: urllib3.HTTPConnectionPool
        if parts.scheme == "https":
            pool = urllib3.HTTPSConnectionPool(
                address,
                port,
                server_hostname=parts.hostname,
                assert_hostname=parts.hostname,
                timeout=timeout,
                retries=False,
            )
        else:
            pool = urllib3.HTTPConnectionPool(address, port, timeout=timeout, retries=False)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        try:
            response = pool.urlopen(
                "GET", path, headers={"Host": parts.netloc, "Accept": "image/*"}, redirect=False, preload_content=False
            )
        except urllib3.exceptions.HTTPError as exc:
            raise _refused(url, f"it could not be reached ({type(exc).__name__})") from None
        try:
            if response.status in (301, 302, 303, 307, 308):
                location = response.headers.get("Location")
                if not location:
                    raise _refused(url, "it redirects nowhere")
                url = urljoin(url, location)
                continue
            if response.status != 200:
                raise _refused(url, f"it answered {response.status}")
            body = b""
            for chunk in response.stream(64 * 1024):
                body += chunk
                if len(body) > max_bytes:
                    raise ClientError(
                        f"The image at {url[:200]} is larger than your plan takes ({max_bytes // 1048576} MB).",
                        code="image_too_large",
                        status=413,
                        param="messages",
                    )
            return body
        finally:
            response.release_conn()
            pool.close()
    raise _refused(url, f"it redirects more than {settings.API_IMAGE_URL_REDIRECTS} times")
