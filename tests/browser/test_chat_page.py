"""The chat page in a real browser (Debian's headless Chromium, driven by Playwright).

The server is uvicorn serving the real ASGI app on the test session's event loop, so it shares the
one engine the other engine tests use.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from conversations.models import Message
from tests.conftest import PASSWORD

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.engine,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"


@pytest.fixture
async def page(chat_server):
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        context = await browser.new_context(base_url=chat_server)
        page = await context.new_page()
        page.set_default_timeout(90_000)
        yield page
        await browser.close()


async def sign_up(page, username: str) -> None:
    await page.goto("/accounts/signup/")
    await page.fill("input[name=username]", username)
    await page.fill("input[name=password1]", PASSWORD)
    await page.fill("input[name=password2]", PASSWORD)
    await page.click("button[type=submit]")
    await page.wait_for_selector("#composer")
    # The page refuses a message until its socket is open ("Not connected yet"): on a busy machine
    # that can take longer than typing does.
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")


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
    await sign_up(page, "frank")
    await page.fill("#input", "Write a very long story about a lighthouse keeper and his cat.")
    await page.click("#send")
    answer = page.locator("article.message.assistant").last
    await page.wait_for_function(
        "() => { const c = document.querySelectorAll('article.message.assistant .content'); return c.length && c[c.length-1].textContent.length > 20; }"
    )
    await page.click("#stop")
    await page.wait_for_selector("article.message.assistant.status-stopped")
    shown = await answer.locator(".content").text_content()
    assert "Stopped" in await answer.text_content()
    saved = await Message.objects.filter(role="assistant").alatest("created_at")
    assert saved.status == Message.Status.STOPPED
    assert saved.content == shown
    assert await page.is_visible("#send")


async def test_text_that_looks_like_html_stays_text(page):
    await sign_up(page, "grace")
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
