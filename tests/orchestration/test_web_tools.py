"""The built-in web tools against a search engine and pages served on loopback by the test itself."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from aiohttp import web
from django.test import override_settings

from orchestration.models import ToolGrant
from orchestration.tools.base import ToolContext
from orchestration.tools.web import (
    FetchPage,
    FetchRefused,
    WebSearch,
    address_allowed,
    html_text,
    page_fetch,
    url_checked,
)
from tests.helpers.sockets import next_event, open_socket

CONTEXT = ToolContext(user_id=1, conversation_id=None, timeout_s=5, max_output_chars=2000)
PAGE = """<html><head><title>Tide tables</title><style>body{color:red}</style>
<script>alert("never shown")</script></head>
<body><h1>High water</h1><p>At 06:12 and 18:40.</p><noscript>Turn on scripts</noscript></body></html>"""


class Site:
    """A search engine and a few pages on 127.0.0.1, counting what it is asked."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.authorization = ""
        app = web.Application()
        app.router.add_get("/search", self.search)
        app.router.add_get("/page", lambda r: self.seen(r, web.Response(text=PAGE, content_type="text/html")))
        app.router.add_get("/moved", lambda r: self.seen(r, web.HTTPFound("/page")))
        app.router.add_get("/loop", lambda r: self.seen(r, web.HTTPFound("/loop")))
        app.router.add_get("/picture", lambda r: self.seen(r, web.Response(body=b"\x89PNG", content_type="image/png")))
        app.router.add_get("/big", lambda r: self.seen(r, web.Response(text="a" * 100_000, content_type="text/plain")))
        self.runner = web.AppRunner(app)

    async def seen(self, request, response):
        self.requests.append(request.path)
        if isinstance(response, Exception):
            raise response
        return response

    async def search(self, request):
        self.requests.append(request.path)
        self.authorization = request.headers.get("Authorization", "")
        query = request.query.get("q", "")
        results = [
            {"title": f"About {query}", "url": "https://example.org/a", "content": "The first result."},
            {"title": "Second", "url": "https://example.org/b", "snippet": "The second result."},
        ]
        return web.json_response({"query": query, "results": results})

    async def start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"


@pytest.fixture
async def site():
    served = Site()
    served.url = await served.start()
    yield served
    await served.runner.cleanup()


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("93.184.216.34", True),
        ("2606:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),
    ],
)
def test_only_global_addresses_may_be_fetched(address, allowed):
    assert address_allowed(address) is allowed


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.org/",
        "http://user:secret@example.org/",
        "http://127.0.0.1/",
        "http://[::1]/",
        "http:///x",
    ],
)
def test_an_address_that_is_not_plain_public_http_is_refused_before_any_connection(url):
    with pytest.raises(FetchRefused):
        url_checked(url)


def test_a_page_is_reduced_to_its_text_without_scripts_or_styles():
    title, text = html_text(PAGE)
    assert title == "Tide tables"
    assert text.splitlines() == ["High water", "At 06:12 and 18:40."]


async def test_a_fetch_of_a_loopback_page_is_refused_unless_the_operator_allows_it(site):
    result = await FetchPage().run(arguments={"url": f"{site.url}/page"}, context=CONTEXT)
    assert result.failed and "private or local" in result.content
    # By name too: the resolver checks what the name resolves to, before any connection.
    port = site.url.rsplit(":", 1)[1]
    with pytest.raises(FetchRefused):
        await page_fetch(f"http://localhost:{port}/page")
    assert site.requests == []


@override_settings(TOOLS_FETCH_ALLOW_PRIVATE=True)
async def test_with_the_allowance_a_page_is_fetched_as_text(site):
    result = await FetchPage().run(arguments={"url": f"{site.url}/page"}, context=CONTEXT)
    assert not result.failed
    assert result.content == f"Tide tables\n{site.url}/page\n\nHigh water\nAt 06:12 and 18:40."
    assert "alert" not in result.content and result.details["title"] == "Tide tables"


@override_settings(TOOLS_FETCH_ALLOW_PRIVATE=True, TOOLS_FETCH_MAX_REDIRECTS=2)
async def test_redirects_are_followed_within_their_limit(site):
    moved = await FetchPage().run(arguments={"url": f"{site.url}/moved"}, context=CONTEXT)
    assert not moved.failed and moved.details["url"] == f"{site.url}/page"
    looping = await FetchPage().run(arguments={"url": f"{site.url}/loop"}, context=CONTEXT)
    assert looping.failed and "More than 2 redirects" in looping.content
    assert site.requests.count("/loop") == 3


@override_settings(TOOLS_FETCH_ALLOW_PRIVATE=True, TOOLS_FETCH_MAX_BYTES=2048)
async def test_only_text_is_taken_and_only_so_much_of_it(site):
    picture = await FetchPage().run(arguments={"url": f"{site.url}/picture"}, context=CONTEXT)
    assert picture.failed and "not text" in picture.content
    big = await FetchPage().run(arguments={"url": f"{site.url}/big"}, context=CONTEXT)
    assert not big.failed and big.truncated and len(big.content) == CONTEXT.max_output_chars
    _, _, text = await page_fetch(f"{site.url}/big")
    assert len(text) == 2048


async def test_a_search_asks_the_operators_searxng_and_lists_its_results(site):
    with override_settings(TOOLS_SEARCH_URL=f"{site.url}/search", TOOLS_SEARCH_COST="0.002"):
        result = await WebSearch().run(arguments={"query": "tides"}, context=CONTEXT)
    assert not result.failed and result.cost == Decimal("0.002")
    assert result.content.startswith("[1] About tides\nhttps://example.org/a\nThe first result.")
    assert "[2] Second\nhttps://example.org/b\nThe second result." in result.content
    assert site.authorization == ""


async def test_a_generic_search_api_gets_its_key_as_a_bearer_token(site):
    with override_settings(
        TOOLS_SEARCH_URL=f"{site.url}/search", TOOLS_SEARCH_KIND="generic", TOOLS_SEARCH_API_KEY="k-123"
    ):
        result = await WebSearch().run(arguments={"query": "tides"}, context=CONTEXT)
    assert not result.failed and site.authorization == "Bearer k-123"


async def test_a_search_provider_that_is_down_is_a_failed_call():
    with override_settings(TOOLS_SEARCH_URL="http://127.0.0.1:9/search"):
        result = await WebSearch().run(arguments={"query": "tides"}, context=CONTEXT)
    assert result.failed and "could not be reached" in result.content


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
async def test_a_web_search_the_person_asks_for_runs_through_the_loop(engine, alice, site):
    from asgiref.sync import sync_to_async

    from inference.models import ModelDeployment

    deployment = await ModelDeployment.objects.aget(name="smollm2-135m")
    await sync_to_async(ToolGrant.objects.get_or_create)(deployment=deployment, tier=None, tool="web_search")
    with override_settings(TOOLS_SEARCH_URL=f"{site.url}/search"):
        socket, _ = await open_socket(alice)
        await socket.send_json_to({"type": "message.send", "content": "tides at Brest", "tool": "web_search"})
        events = []
        while not events or events[-1]["type"] not in ("generation.done", "generation.error", "error"):
            events.append(await next_event(socket, timeout=60))
            await asyncio.sleep(0)
    result = next(e for e in events if e["type"] == "tool.result")
    assert result["name"] == "web_search" and result["outcome"] == "ok"
    assert "About scripted" in result["output"] and result["details"]["query"] == "scripted"
    assert events[-1]["type"] == "generation.done"
    await socket.disconnect()
