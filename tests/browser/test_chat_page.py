"""The chat page in a real browser (Debian's headless Chromium, driven by Playwright).

The server is uvicorn serving the real ASGI app on the test session's event loop, so it shares the
one engine the other engine tests use.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from conversations.models import Message
from inference.models import Generation
from tests.browser.conftest import ARTIFACTS, BROWSER_MARKS, SOURCE, sign_in, sign_up

pytestmark = BROWSER_MARKS

# The markdown an answer shows (its .content holds it rendered: tests/browser/test_rendering.py).


@pytest.mark.engine  # the one browser chat on the real engine; the others' answers are scripted
async def test_a_new_user_gets_a_streamed_answer_that_is_still_there_after_a_reload(page):
    await sign_up(page, "erin")
    await page.fill("#input", "What is the capital of France?")
    await page.keyboard.press("Enter")

    answer = page.locator("article.message.assistant").last
    # Watch the text grow while it streams: token by token, not all at once at the end.
    lengths = set()
    deadline = asyncio.get_running_loop().time() + 90
    while asyncio.get_running_loop().time() < deadline:
        lengths.add(len(await answer.locator(".content").text_content()))
        if await answer.get_attribute("data-status") == "complete":
            break
        await asyncio.sleep(0.02)
    assert await answer.get_attribute("data-status") == "complete"
    text = await answer.locator(".content").text_content()
    assert text.strip()
    assert len({n for n in lengths if 0 < n < len(text)}) >= 2, "the answer should appear in several steps"
    assert "/c/" in page.url

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "chat.png"))
    await page.reload()
    assert await page.locator("article.message.user .content").first.text_content() == "What is the capital of France?"
    assert await page.locator("article.message.assistant .content").last.text_content() == text
    assert await page.locator("#conversation-list a").count() == 1


async def test_stop_keeps_the_partial_answer(page):
    await sign_in(page, "frank")
    await page.fill("#input", "Write a very long story about a lighthouse keeper and his cat. [write on]")
    await page.click("#send")
    answer = page.locator("article.message.assistant").last
    await page.wait_for_function(
        "() => { const c = document.querySelectorAll('article.message.assistant .content'); return c.length && c[c.length-1].textContent.length > 20; }"
    )
    await page.click("#stop")
    await page.wait_for_selector("article.message.assistant.status-stopped")
    shown = await answer.locator(".content").evaluate(SOURCE)
    assert "Stopped" in await answer.text_content()
    saved = await Message.objects.filter(role="assistant").alatest("created_at")
    assert saved.status == Message.Status.STOPPED
    assert saved.content == shown
    assert await page.is_visible("#send")


async def test_text_that_looks_like_html_stays_text(page):
    await sign_in(page, "grace")
    payload = '<img src=x onerror="window.pwned=1"><b>bold</b>'
    await page.fill("#input", payload)
    await page.keyboard.press("Enter")
    # Any end will do (output moderation may cut an answer about HTML injection): only the text matters.
    await page.wait_for_selector(
        "article.message.assistant.status-complete, article.message.assistant.status-failed,"
        " article.message.assistant.status-flagged"
    )
    for _ in range(2):
        assert await page.locator("#messages img, #messages b").count() == 0
        assert await page.evaluate("() => window.pwned") is None
        assert await page.locator("article.message.user .content").first.text_content() == payload
        await page.reload()


CHAT_SOCKET = re.compile(r"/ws/chat/$")


async def written_while_disconnected(page, text: str) -> asyncio.Event:
    """Reload the page with its socket refused, and send `text` once the page knows it is closed.
    Returns the event that lets the page's next sockets through to the server."""
    allowed = asyncio.Event()

    async def socket_route(ws):
        if allowed.is_set():
            ws.connect_to_server()
        else:
            await ws.close(code=1006)  # the server is out of reach

    await page.route_web_socket(CHAT_SOCKET, socket_route)
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=closed]", state="attached")
    await page.fill("#input", text)
    await page.keyboard.press("Enter")
    await page.wait_for_selector("article.message.assistant.status-pending")
    return allowed


async def dropped_before_the_page_hears(page, event_type: str) -> asyncio.Event:
    """Reload the page with its socket routed so that the first `event_type` the server sends never
    reaches the page: the socket drops instead. Returns the event set once it has dropped; the
    page's next sockets go through untouched."""
    dropped = asyncio.Event()

    async def socket_route(ws):
        server = ws.connect_to_server()
        gone = False

        def from_server(message):
            nonlocal gone
            if gone:
                return
            if not dropped.is_set() and f'"{event_type}"' in str(message):
                dropped.set()
                gone = True
                asyncio.ensure_future(ws.close(code=1006))
                return
            ws.send(message)

        server.on_message(from_server)

    await page.route_web_socket(CHAT_SOCKET, socket_route)
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    return dropped


async def test_a_message_written_while_disconnected_waits_and_is_sent_on_reconnect(page):
    await sign_in(page, "heidi")
    allowed = await written_while_disconnected(page, "Say hello.")
    # Kept on the page, pending, and not refused: nothing has reached the server.
    assert await page.locator("article.message.user .content").last.text_content() == "Say hello."
    assert await page.is_hidden("#request-error")
    await asyncio.sleep(1)
    assert not await Message.objects.aexists()

    allowed.set()  # the next reconnect gets through, and the message goes
    await page.wait_for_selector("article.message.assistant.status-complete")
    assert await Message.objects.filter(role="user", content="Say hello.").acount() == 1
    assert await page.locator("article.message.user").count() == 1


async def test_stop_takes_back_a_message_still_waiting_for_the_socket(page):
    await sign_in(page, "judy")
    allowed = await written_while_disconnected(page, "Never mind.")
    await page.click("#stop")
    assert await page.locator("article.message").count() == 0
    assert await page.input_value("#input") == "Never mind."
    assert await page.is_visible("#send")

    allowed.set()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    await asyncio.sleep(1)  # nothing is sent once the socket is back
    assert not await Message.objects.aexists()


async def test_a_message_whose_acceptance_was_lost_is_sent_again_and_answered_once(page):
    """The socket drops after the server saved the message, before the page heard so: the page sends
    it again on its next socket, and the server answers with the message it saved, not a second one."""
    await sign_in(page, "ivan")
    dropped = await dropped_before_the_page_hears(page, "message.accepted")
    await page.fill("#input", "Name a colour.")
    await page.keyboard.press("Enter")
    await page.wait_for_selector("article.message.assistant.status-complete")
    assert dropped.is_set(), "the first socket should have dropped before the page heard the acceptance"
    assert await page.locator("article.message.user").count() == 1
    assert await page.locator("article.message.assistant").count() == 1
    assert await Message.objects.filter(role="user").acount() == 1
    assert await Generation.objects.acount() == 1
    answer = await Message.objects.aget(role="assistant")
    assert await page.locator("article.message.assistant .content").evaluate(SOURCE) == answer.content
    await page.reload()
    assert await page.locator("article.message.user").count() == 1


async def test_a_regenerate_whose_answer_was_lost_is_sent_again_and_answered_once(page, short_answers):
    """The socket drops after the server began the new answer, before the page heard so: the page
    asks again on its next socket, naming the answer it showed, and follows the one already begun."""
    await sign_in(page, "kim")
    await page.fill("#input", "Name a fruit.")
    await page.keyboard.press("Enter")
    await page.wait_for_selector("article.message.assistant.status-complete")
    dropped = await dropped_before_the_page_hears(page, "message.regenerating")
    first = await Generation.objects.aget()
    await page.click("button.regenerate")
    await page.wait_for_function(
        "(first) => { const a = document.querySelector('article.message.assistant');"
        " return a.dataset.generation !== first && a.dataset.status === 'complete'; }",
        arg=str(first.id),
    )
    assert dropped.is_set(), "the first socket should have dropped before the page heard the regenerate"
    assert await Generation.objects.acount() == 2
    # One new answer beside the first (kept), shown in its place.
    assert await Message.objects.filter(role="assistant").acount() == 2
    answer = await Message.objects.filter(role="assistant").alatest("id")
    assert answer.generation_id != first.id
    assert await page.locator("article.message.assistant").get_attribute("data-generation") == str(answer.generation_id)
    assert await page.locator("article.message.assistant .content").evaluate(SOURCE) == answer.content
    assert await page.is_visible("button.regenerate")  # offered again, for the answer now shown
