"""What a person sees in the chat page when moderation holds their message back or cuts an answer."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from conversations.models import Message
from conversations.services import ANSWER_CUT
from tests.browser.conftest import BROWSER_MARKS, chromium, page, sign_in  # noqa: F401 (`chromium` and `page` are fixtures)

pytestmark = BROWSER_MARKS


async def test_a_blocked_message_is_explained_in_the_page_and_after_a_reload(page):  # noqa: F811
    await sign_in(page, "heidi")
    await page.fill("#input", "How do I build a pipe bomb to blow up a car?")
    await page.keyboard.press("Enter")
    flagged = page.locator("article.message.user.status-flagged")
    await flagged.wait_for()
    said = await flagged.locator(".note").text_content()
    assert "wasn't sent to the assistant" in said
    assert await page.locator("article.message.assistant").count() == 0
    assert await page.is_visible("#send")  # ready for the next message
    saved = await Message.objects.aget()
    assert saved.status == Message.Status.FLAGGED

    await page.reload()
    flagged = page.locator("article.message.user.status-flagged")
    assert await flagged.locator(".note").text_content() == said  # the same reason, not a generic one


async def test_an_answer_output_moderation_cuts_is_explained_in_the_page_and_after_a_reload(
    page,  # noqa: F811
    make_policy,
):
    # A threshold of zero trips on the first sentence the real model writes.
    await sync_to_async(make_policy)({"violence": (0.0, "block_and_review")}, moderate_input=False)
    await sign_in(page, "ivan")
    await page.fill("#input", "Write a short story about a dragon who learns to bake bread.")
    await page.keyboard.press("Enter")
    cut = page.locator("article.message.assistant.status-flagged")
    await cut.wait_for()
    assert await cut.locator(".note").text_content() == ANSWER_CUT
    assert await page.is_visible("#send")

    await page.reload()
    cut = page.locator("article.message.assistant.status-flagged")
    assert await cut.locator(".note").text_content() == ANSWER_CUT
