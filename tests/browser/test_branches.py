"""The conversation as a tree on the chat page: edits and regenerations as branches, ‹ n / m ›
navigation that a reload keeps, Copy, feedback, Continue after a length cut, and Retry."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from accounts.models import Tier, User, UserSettings
from conversations.models import Conversation, Message, MessageFeedback
from conversations.requests import SendRequest
from conversations.services import message_send
from inference.models import Generation
from inference.services import generation_finish
from tests.browser.conftest import BROWSER_MARKS, SOURCE, sign_in

# These tests are about the tree, not what the answers say.
pytestmark = [*BROWSER_MARKS, pytest.mark.usefixtures("short_answers")]

ENDED = "complete", "failed", "flagged"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}


async def _answered(page, count: int) -> None:
    """Wait until the page shows `count` answers, the last of them ended."""
    await page.wait_for_function(
        "(count) => { const a = document.querySelectorAll('article.message.assistant');"
        " return a.length === count && ['complete', 'failed', 'flagged'].includes(a[a.length - 1].dataset.status)"
        " && document.getElementById('stop').hidden; }",
        arg=count,
    )


async def _answered_anew(page, old_generation: str) -> None:
    """Wait until the last answer on the page is written by a generation other than `old_generation`,
    and has ended."""
    await page.wait_for_function(
        "(old) => { const a = [...document.querySelectorAll('article.message.assistant')].pop();"
        " return a.dataset.generation !== old && ['complete', 'failed', 'flagged'].includes(a.dataset.status)"
        " && document.getElementById('stop').hidden; }",
        arg=old_generation,
    )


async def _ask(page, text: str) -> None:
    await page.fill("#input", text)
    await page.keyboard.press("Enter")
    await _answered(page, await page.locator("article.message.user").count())


async def test_an_edit_is_a_branch_the_page_navigates_and_a_reload_keeps(page):
    await sign_in(page, "nina")
    await _ask(page, "Name a colour.")
    question = page.locator("article.message.user").first
    await question.locator("button.edit").click()
    await question.locator(".edit-form textarea").fill("Name a fruit.")
    await question.locator(".edit-form button.edit-send").click()
    await _answered(page, 1)

    # The edit replaced the branch on the page; the first branch is kept beside it.
    shown = page.locator("article.message.user")
    assert await shown.count() == 1
    assert await shown.locator(".content").text_content() == "Name a fruit."
    assert await shown.locator(".branch-position").text_content() == "2 / 2"
    questions = [m async for m in Message.objects.filter(role="user").order_by("id")]
    assert [(m.content, m.parent_id) for m in questions] == [("Name a colour.", None), ("Name a fruit.", None)]
    answer = await Message.objects.filter(role="assistant").alatest("id")
    prompt = await Generation.objects.aget(id=answer.generation_id)
    first = await Generation.objects.exclude(id=answer.generation_id).aget()
    assert prompt.prompt_token_ids != first.prompt_token_ids  # the edit's prompt is its own branch

    # ‹ shows the first branch, with its answer; a reload keeps it.
    await shown.locator("button.branch-prev").click()
    await page.wait_for_selector("article.message.user .branch-position >> text='1 / 2'")
    assert await page.locator("article.message.user .content").text_content() == "Name a colour."
    await page.reload()
    assert await page.locator("article.message.user .content").text_content() == "Name a colour."
    assert await page.locator("article.message.user .branch-position").text_content() == "1 / 2"
    assert await page.locator("article.message.assistant").count() == 1
    await page.locator("article.message.user button.branch-next").click()
    await page.wait_for_selector("article.message.user .branch-position >> text='2 / 2'")
    assert await page.locator("article.message.user .content").text_content() == "Name a fruit."


async def test_regenerate_adds_an_answer_beside_the_old_and_answers_take_copy_and_feedback(page):
    await sign_in(page, "oscar")
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await _ask(page, "Say hi.")
    first_text = await page.locator("article.message.assistant .content").evaluate(SOURCE)
    first_generation = await page.locator("article.message.assistant").get_attribute("data-generation")
    await page.click("button.regenerate")
    await _answered_anew(page, first_generation)
    assert await Message.objects.filter(role="assistant").acount() == 2
    answer = await Message.objects.filter(role="assistant").alatest("id")
    shown = page.locator("article.message.assistant")
    assert await shown.get_attribute("data-message") == str(answer.id)
    assert "tokens" in (await shown.get_attribute("title"))

    # The old answer is one click away, as it was.
    await shown.locator("button.branch-prev").click()
    await page.wait_for_selector("article.message.assistant .branch-position >> text='1 / 2'")
    assert await page.locator("article.message.assistant .content").evaluate(SOURCE) == first_text

    shown = page.locator("article.message.assistant")
    await shown.locator("button.copy").click()
    await page.wait_for_selector("article.message.assistant[data-copied=true]")
    assert await page.evaluate("() => navigator.clipboard.readText()") == first_text

    await shown.locator("button.rate-down").click()
    await shown.locator(".feedback-form textarea").fill("Too short.")
    await shown.locator(".feedback-form button[type=submit]").click()
    await page.wait_for_selector("article.message.assistant[data-feedback-sent=true]")
    feedback = await MessageFeedback.objects.aget()
    assert (feedback.rating, feedback.comment) == ("down", "Too short.")
    assert await shown.locator("button.rate-down").get_attribute("aria-pressed") == "true"
    await page.reload()
    assert await page.locator("article.message.assistant button.rate-down").get_attribute("aria-pressed") == "true"


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_the_thumbs_are_easy_to_hit_and_the_chosen_one_clicked_again_takes_the_rating_back(page, viewport, theme):
    await page.set_viewport_size(viewport)
    await sign_in(page, "sara")
    await UserSettings.objects.aupdate_or_create(
        user=await User.objects.aget(username="sara"), defaults={"theme": theme}
    )
    await _ask(page, "Say hi.")
    await page.reload()
    answer = page.locator("article.message.assistant")
    up, down = answer.locator("button.rate-up"), answer.locator("button.rate-down")
    first, second = await up.bounding_box(), await down.bounding_box()
    assert min(first["width"], first["height"], second["width"], second["height"]) >= 24
    assert second["x"] - (first["x"] + first["width"]) >= 4, "the thumbs do not touch"
    unpressed = await up.evaluate("b => getComputedStyle(b).backgroundColor")

    await up.click()
    await page.wait_for_selector("article.message.assistant button.rate-up[aria-pressed=true]")
    assert (await MessageFeedback.objects.aget()).rating == "up"
    await page.mouse.move(0, 0)  # not a hover: the pressed look itself
    assert await up.evaluate("b => getComputedStyle(b).backgroundColor") != unpressed, "the choice shows"
    assert await answer.locator(".feedback-form").count() == 1

    await up.click()
    await page.wait_for_selector("article.message.assistant button.rate-up[aria-pressed=false]")
    assert not await MessageFeedback.objects.aexists()
    assert await answer.locator(".feedback-form").count() == 0
    await page.reload()
    assert await page.locator("article.message.assistant button.rate-up").get_attribute("aria-pressed") == "false"


async def _actions_in_order(page) -> list[str]:
    """The answer's actions row and its Regenerate button, in the order the page shows them."""
    return await page.locator("article.message.assistant").last.evaluate(
        "a => Array.from(a.children).flatMap(c => c.matches('.actions') ? ['actions']"
        " : c.matches('button.regenerate') ? ['regenerate'] : [])"
    )


async def test_regenerate_comes_after_copy_and_the_thumbs_live_and_after_a_reload(page):
    await sign_in(page, "tess")
    await _ask(page, "Say hi.")
    live = await _actions_in_order(page)
    await page.reload()
    await page.wait_for_selector("article.message.assistant .actions button.rate-up")
    assert live == await _actions_in_order(page) == ["actions", "regenerate"]


async def _conversation_with_an_ended_answer(username: str, monkeypatch, **finish) -> Conversation:
    """A conversation whose answer ended as `finish` says, made without the engine."""
    user = await User.objects.aget(username=username)
    with monkeypatch.context() as patched:
        patched.setattr("inference.services.generation_dispatch", lambda **dispatch: None)
        sent = await database_sync_to_async(message_send)(user=user, request=SendRequest(content="What is 2 + 2?"))
    await database_sync_to_async(generation_finish)(generation_id=sent.generation.id, **finish)
    return sent.conversation


async def test_an_answer_cut_at_its_length_limit_says_so_after_a_reload_and_continues(page, monkeypatch):
    await sign_in(page, "petra")
    conversation = await _conversation_with_an_ended_answer(
        "petra", monkeypatch, status="complete", text="2 + 2 equals", finish_reason="length", completion_tokens=5
    )
    await page.goto(f"/c/{conversation.id}/")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    answer = page.locator("article.message.assistant")
    assert "reached its length limit" in await answer.locator(".note.length").text_content()
    assert (await answer.get_attribute("title")).startswith("5 tokens")
    cut = await answer.get_attribute("data-generation")
    await answer.locator("button.continue").click()
    await _answered_anew(page, cut)
    saved = await Message.objects.aget(role="assistant")
    assert str(saved.generation_id) != cut and saved.status in ENDED
    assert saved.content.startswith("2 + 2 equals") and saved.token_count >= 5
    assert await answer.locator(".content").evaluate(SOURCE) == saved.content
    assert await Generation.objects.acount() == 2
    await page.reload()
    assert await page.locator("article.message.assistant .content").evaluate(SOURCE) == saved.content


async def test_regenerate_after_a_stopped_continue_answers_anew_beside_the_whole_answer(page):
    await sign_in(page, "rosa")
    await _ask(page, "Tell a long story. [write on]")  # cut at its length limit (short_answers)
    answer = page.locator("article.message.assistant")
    cut_text = await answer.locator(".content").evaluate(SOURCE)
    # The continuation runs on until it is stopped.
    await Tier.objects.filter(name="free").aupdate(max_output_tokens=4000)
    await answer.locator("button.continue").click()
    await page.wait_for_function(
        "(n) => ChatRender.source(document.querySelector('article.message.assistant .content')).length > n + 20",
        arg=len(cut_text),
    )
    await page.keyboard.press("Escape")
    await page.wait_for_selector("article.message.assistant.status-stopped")
    continued = await Message.objects.aget(role="assistant")
    assert continued.status == "stopped" and continued.content.startswith(cut_text)
    assert await answer.locator(".content").evaluate(SOURCE) == continued.content

    await Tier.objects.filter(name="free").aupdate(max_output_tokens=48)
    await page.click("button.regenerate")
    await page.wait_for_function(
        "(old) => { const a = document.querySelector('article.message.assistant');"
        " return a.dataset.message !== old && ['complete', 'failed', 'flagged'].includes(a.dataset.status)"
        " && document.getElementById('stop').hidden; }",
        arg=str(continued.id),
    )
    # A new answer beside the whole one, which is kept as it was; the page shows what the server has.
    assert await Message.objects.filter(role="assistant").acount() == 2
    assert await Generation.objects.acount() == 3
    new = await Message.objects.filter(role="assistant").alatest("id")
    assert await answer.get_attribute("data-message") == str(new.id)
    assert await answer.locator(".content").evaluate(SOURCE) == new.content
    assert await answer.locator(".branch-position").text_content() == "2 / 2"
    assert (await Message.objects.aget(id=continued.id)).content == continued.content
    await answer.locator("button.branch-prev").click()
    await page.wait_for_selector("article.message.assistant .branch-position >> text='1 / 2'")
    assert await page.locator("article.message.assistant .content").evaluate(SOURCE) == continued.content
    await page.reload()
    assert await page.locator("article.message.assistant .content").evaluate(SOURCE) == continued.content


async def test_a_failed_answer_says_why_and_retry_answers_again_beside_it(page, monkeypatch):
    await sign_in(page, "quinn")
    conversation = await _conversation_with_an_ended_answer(
        "quinn", monkeypatch, status="failed", text="", error_code="worker_lost", error_message="The worker stopped."
    )
    await page.goto(f"/c/{conversation.id}/")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    answer = page.locator("article.message.assistant")
    assert "This answer failed: The worker stopped." in await answer.locator(".note.error").text_content()
    retry = answer.locator("button.regenerate")
    assert await retry.text_content() == "Retry"
    failed = await answer.get_attribute("data-generation")
    await retry.click()
    await _answered_anew(page, failed)
    assert await page.locator("article.message.assistant .branch-position").text_content() == "2 / 2"
    statuses = [m.status async for m in Message.objects.filter(role="assistant").order_by("id")]
    assert statuses[0] == "failed" and statuses[1] in ENDED
