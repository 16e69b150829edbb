"""The built-in web tools: a search through the operator's provider, and fetching a page as text.

`web_search` asks the provider the operator configured (`TOOLS_SEARCH_URL`): a SearXNG instance's
JSON API, or a generic search API that takes `q` and answers `{"results": [{title, url, content or
snippet}]}`, its key (`TOOLS_SEARCH_API_KEY`) sent as a bearer token. The provider's address is the
operator's own and is not checked.

`fetch_page` reads an address the model chose, so it is the service's SSRF surface. The host is
resolved and every address it resolves to is checked before the connection is made to one of those
checked addresses (aiohttp's resolver is the service's own, so there is no second lookup to race);
an address literal is checked as written. Private, loopback, link-local and other non-global
addresses are refused unless the operator allows them (`TOOLS_FETCH_ALLOW_PRIVATE`). Redirects are
followed by hand, each hop checked the same way, at most `TOOLS_FETCH_MAX_REDIRECTS`; at most
`TOOLS_FETCH_MAX_BYTES` are read; only text is taken (HTML is reduced to its text with lxml).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import lxml.html
from aiohttp.abc import AbstractResolver, ResolveResult
from django.conf import settings

from orchestration.tools.base import ToolContext, ToolResult, ToolSpec, result_clipped

USER_AGENT = "chatsite-fetch/1 (+the operator's chat service)"
SEARCH_RESULTS = 5
TEXT_TYPES = ("text/plain", "text/markdown", "application/json", "text/csv")
HTML_TYPES = ("text/html", "application/xhtml+xml")
# Elements whose text is never a page's reading text.
DROPPED = ("script", "style", "noscript", "template", "svg", "head", "iframe", "object")
BLOCKS = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "section", "article")


class FetchRefused(Exception):
    """An address the fetch may not reach, in words the model and the person can read."""


def address_allowed(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if settings.TOOLS_FETCH_ALLOW_PRIVATE:
        return not ip.is_unspecified and not ip.is_multicast
    return ip.is_global and not ip.is_multicast


class CheckedResolver(AbstractResolver):
    """The system's resolver, keeping only the addresses a fetch may reach; none: refused."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed = [r for r in found if address_allowed(r["host"])]
        if not allowed:
            raise FetchRefused(f"{host} is a private or local address, which the fetch may not reach.")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def url_checked(url: str) -> str:
    """An http(s) address with a host; an address literal is checked here (the resolver never sees it)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchRefused("Only http and https addresses can be fetched.")
    if parts.username or parts.password:
        raise FetchRefused("Addresses with a user name or password are not fetched.")
    try:
        ipaddress.ip_address(parts.hostname)
    except ValueError:
        return url  # a name: the resolver checks what it resolves to
    if not address_allowed(parts.hostname):
        raise FetchRefused(f"{parts.hostname} is a private or local address, which the fetch may not reach.")
    return url


def html_text(html: str) -> tuple[str, str]:
    """A page's title and its reading text, one block a line."""
    try:
        document = lxml.html.document_fromstring(html)
    except (ValueError, lxml.etree.ParserError):
        return "", ""
    title = " ".join((document.findtext(".//title") or "").split())
    for element in list(document.iter(*DROPPED)):
        element.drop_tree()
    for element in document.iter(*BLOCKS):
        element.tail = "\n" + (element.tail or "")
    lines = (" ".join(line.split()) for line in document.text_content().split("\n"))
    return title, "\n".join(line for line in lines if line)


class FetchPage:
    spec = ToolSpec(
        name="fetch_page",
        description="Fetch a web page by its address and return its text.",
        parameters={
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "The page's http or https address.", "maxLength": 2048}
            },
            "required": ["url"],
            "additionalProperties": False,
        },
    )

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        url = str(arguments["url"]).strip()
        try:
            final, title, text = await page_fetch(url)
        except FetchRefused as exc:
            return ToolResult(content=str(exc), failed=True, details={"url": url})
        except (aiohttp.ClientError, UnicodeError, ValueError) as exc:
            return ToolResult(
                content=f"The page could not be fetched ({type(exc).__name__}).", failed=True, details={"url": url}
            )
        heading = f"{title}\n{final}\n\n" if title else f"{final}\n\n"
        clipped = result_clipped(content=heading + text, limit=context.max_output_chars)
        return ToolResult(content=clipped.content, truncated=clipped.truncated, details={"url": final, "title": title})


async def page_fetch(url: str) -> tuple[str, str, str]:
    """The final address, the title and the text of the page at `url` (module docstring)."""
    connector = aiohttp.TCPConnector(resolver=CheckedResolver(), use_dns_cache=False, force_close=True)
    timeout = aiohttp.ClientTimeout(total=settings.TOOLS_TIMEOUT_S)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers={"User-Agent": USER_AGENT}
    ) as session:
        for _ in range(settings.TOOLS_FETCH_MAX_REDIRECTS + 1):
            async with session.get(url_checked(url), allow_redirects=False) as response:
                if response.status in (301, 302, 303, 307, 308) and "Location" in response.headers:
                    url = urljoin(url, response.headers["Location"])
                    continue
                if response.status >= 400:
                    raise FetchRefused(f"The server answered {response.status}.")
                kind = (response.content_type or "").lower()
                if kind not in HTML_TYPES and kind not in TEXT_TYPES and not kind.startswith("text/"):
                    raise FetchRefused(f"The page is not text ({kind or 'no type'}).")
                body = bytearray()
                async for chunk in response.content.iter_chunked(64 * 1024):
                    body += chunk[: settings.TOOLS_FETCH_MAX_BYTES - len(body)]
                    if len(body) >= settings.TOOLS_FETCH_MAX_BYTES:
                        break
                text = bytes(body).decode(response.charset or "utf-8", errors="replace")
                if kind in HTML_TYPES:
                    title, text = html_text(text)
                    return url, title, text
                return url, "", text
        raise FetchRefused(f"More than {settings.TOOLS_FETCH_MAX_REDIRECTS} redirects.")


class WebSearch:
    spec = ToolSpec(
        name="web_search",
        description="Search the web. Returns the best results' titles, addresses and snippets.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to search for.", "minLength": 1, "maxLength": 400}
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    )

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        query = str(arguments["query"]).strip()
        params = {"q": query}
        headers = {"User-Agent": USER_AGENT}
        if settings.TOOLS_SEARCH_KIND == "searxng":
            params["format"] = "json"
        elif settings.TOOLS_SEARCH_API_KEY:
            headers["Authorization"] = f"Bearer {settings.TOOLS_SEARCH_API_KEY}"
        timeout = aiohttp.ClientTimeout(total=context.timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
                async with session.get(settings.TOOLS_SEARCH_URL, params=params, allow_redirects=False) as response:
                    if response.status != 200:
                        return ToolResult(content=f"The search provider answered {response.status}.", failed=True)
                    found = await response.json(content_type=None)
        except (aiohttp.ClientError, ValueError):
            return ToolResult(content="The search provider could not be reached.", failed=True)
        results = [r for r in (found.get("results") if isinstance(found, dict) else None) or [] if isinstance(r, dict)]
        shown = []
        for number, result in enumerate(results[:SEARCH_RESULTS], start=1):
            snippet = " ".join(str(result.get("content") or result.get("snippet") or "").split())
            shown.append(
                f"[{number}] {str(result.get('title') or '').strip()}\n{str(result.get('url') or '').strip()}\n{snippet}"
            )
        text = "\n\n".join(shown) if shown else f"No results for {query!r}."
        clipped = result_clipped(content=text, limit=context.max_output_chars)
        return ToolResult(
            content=clipped.content,
            truncated=clipped.truncated,
            cost=Decimal(settings.TOOLS_SEARCH_COST),
            details={"query": query, "results": [str(r.get("url") or "") for r in results[:SEARCH_RESULTS]]},
        )


def web_search_enabled() -> bool:
    return bool(settings.TOOLS_SEARCH_URL)


def fetch_page_enabled() -> bool:
    return bool(settings.TOOLS_FETCH_ENABLED)
