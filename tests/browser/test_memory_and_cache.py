"""What the chat page shows of the orchestration layer: where a long conversation's summary begins,
which its reader can open and read (inert, like every text of the page), and an answer played back
from the response cache. Rows are written straight into the database; no engine runs."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from accounts.models import User
from conversations.models import ConversationSummary, Message
from conversations.services import conversation_create
from inference.models import Generation
from tests.browser.conftest import BROWSER_MARKS, sign_in

pytestmark = [mark for mark in BROWSER_MARKS if mark.name != "engine"]

SUMMARY = 'They planned a trip to Lyon <img src=x onerror="window.pwned=1"> and chose trains.'


@pytest.fixture
async def chat_server(server_without_engine, monkeypatch):
    from inference.execution.dispatch import local_backend

    async def not_started() -> None:
        return None

    monkeypatch.setattr(local_backend, "start", not_started)
    return server_without_engine


@database_sync_to_async
def _long_conversation(username: str, *, cached: bool = False) -> tuple[int, list[int]]:
    """Three exchanges, the first two summarized; returns the conversation's id and the answers' ids."""
    user = User.objects.get(username=username)
    conversation = conversation_create(user=user, title="Long")
    parent, answers = None, []
    for i in range(3):
        question = Message.objects.create(
            conversation=conversation, role="user", content=f"Question {i}", parent=parent
        )
        generation = Generation.objects.create(
            user=user,
            deployment=conversation.deployment,
            prompt_token_ids=[1],
            status="complete",
            text=f"Answer {i}",
            cached=cached and i == 0,
        )
        parent = Message.objects.create(
            conversation=conversation, role="assistant", parent=question, content=f"Answer {i}", generation=generation
        )
        answers.append(parent.id)
    ConversationSummary.objects.create(
        conversation=conversation, through_id=answers[1], turns_covered=4, status="ready", text=SUMMARY
    )
    return conversation.id, answers


async def test_the_page_shows_where_the_summary_begins_and_it_can_be_read(page):
    await sign_in(page, "alice")
    conversation_id, answers = await _long_conversation("alice")
    await page.goto(f"/c/{conversation_id}/")
    marker = page.locator("#memory-summary")
    assert "Earlier messages are summarized" in await marker.locator("summary").text_content()
    # Right after the last message it stands for: the ones above it are what it summarizes.
    assert await page.locator(f'article[data-message="{answers[1]}"] + #memory-summary').count() == 1
    text = marker.locator(".summary-text")
    assert not await text.is_visible()
    await marker.locator("summary").click()
    assert await text.is_visible()
    assert await text.text_content() == SUMMARY  # shown as text, never as markup
    assert await marker.locator("img").count() == 0
    assert await page.evaluate("window.pwned === undefined")


async def test_an_answer_from_the_cache_is_marked(page):
    await sign_in(page, "bob")
    conversation_id, answers = await _long_conversation("bob", cached=True)
    await page.goto(f"/c/{conversation_id}/")
    assert await page.locator(f'article[data-message="{answers[0]}"] .note.cached').text_content() == (
        "Answered from the cache"
    )
    assert await page.locator(f'article[data-message="{answers[1]}"] .note.cached').count() == 0


@database_sync_to_async
def _summary_written_now(conversation_id: int, through_id: int, text: str) -> None:
    """A summary's generation ends as the runner ends one: its finish settles the summary, and the
    owner's pages are told once that commits."""
    from django.db import transaction

    from conversations.summaries import summary_on_finish

    conversation = Message.objects.get(id=through_id).conversation
    generation = Generation.objects.create(
        user=conversation.user,
        deployment=conversation.deployment,
        prompt_token_ids=[1],
        purpose="summary",
        status="complete",
        finish_reason="stop",
        text=text,
    )
    ConversationSummary.objects.create(
        conversation_id=conversation_id, through_id=through_id, turns_covered=2, generation=generation
    )
    with transaction.atomic():
        summary_on_finish(generation=generation)


async def test_a_summary_written_while_the_page_is_open_shows_without_a_reload(page):
    await sign_in(page, "carol")
    conversation_id, answers = await _long_conversation("carol")
    await page.goto(f"/c/{conversation_id}/")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    await _summary_written_now(conversation_id, answers[0], "They met.\nThen <b>they</b> talked.")

    marker = page.locator(f'article[data-message="{answers[0]}"] + #memory-summary')
    await marker.wait_for(timeout=10_000)
    assert await page.locator("#memory-summary").count() == 1  # the one shown before is replaced
    await marker.locator("summary").click()
    assert await marker.locator(".summary-text").inner_text() == "They met.\nThen <b>they</b> talked."
    assert await marker.locator("b").count() == 0
