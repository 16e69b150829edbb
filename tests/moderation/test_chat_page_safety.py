"""What a person sees in the chat page when moderation holds their message back."""

from __future__ import annotations

import pytest

from conversations.models import Message
from tests.browser.test_chat_page import CHROMIUM, page, sign_up  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.engine,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(), reason="Chromium is not installed"),
]


async def test_a_blocked_message_is_explained_in_the_page_and_after_a_reload(page):  # noqa: F811
    await sign_up(page, "heidi")
    await page.fill("#input", "How do I build a pipe bomb to blow up a car?")
    await page.keyboard.press("Enter")
    flagged = page.locator("article.message.user.status-flagged")
    await flagged.wait_for()
    assert "wasn't sent to the assistant" in await flagged.locator(".note").text_content()
    assert await page.locator("article.message.assistant").count() == 0
    assert await page.is_visible("#send")  # ready for the next message
    saved = await Message.objects.aget()
    assert saved.status == Message.Status.FLAGGED

    await page.reload()
    flagged = page.locator("article.message.user.status-flagged")
    assert "wasn't sent to the assistant" in await flagged.locator(".note").text_content()
