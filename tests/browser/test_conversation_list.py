"""The conversation list and a conversation's actions in a real browser: the title the model writes
arriving without a reload, rename in place, pin, search, delete on a chat just started, sharing, and
a message sent in one tab appearing in another."""

from __future__ import annotations

import json

from channels.db import database_sync_to_async
from playwright.async_api import expect

from accounts.models import User
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from conversations.services import titles as conversation_titles
from inference.models import Generation
from tests.browser.conftest import BROWSER_MARKS, SOURCE, sign_in

pytestmark = BROWSER_MARKS

ANSWER_ENDED = (
    "article.message.assistant.status-complete, article.message.assistant.status-stopped,"
    " article.message.assistant.status-failed, article.message.assistant.status-flagged"
)


async def _chat(username: str, title: str, *exchange: str) -> Conversation:
    user = await User.objects.aget(username=username)
    conversation = await database_sync_to_async(conversation_create)(user=user, title=title)
    parent = None  # one branch: each message follows the one before it
    for role, content in zip(("user", "assistant") * len(exchange), exchange, strict=False):
        parent = await Message.objects.acreate(conversation=conversation, role=role, content=content, parent=parent)
    return conversation


async def test_a_new_chat_gets_the_models_title_and_its_actions_without_a_reload(page, settings, monkeypatch):
    settings.CHAT_TITLES_FROM_MODEL = True
    await sign_in(page, "hazel")
    assert await page.locator("#conversation-actions").is_hidden()
    await page.fill("#input", "What is the capital of France?")
    await page.keyboard.press("Enter")
    await page.wait_for_selector(ANSWER_ENDED)
    # The title arrives over the socket once the model has written it: header, list and tab follow.
    await page.wait_for_function("() => document.getElementById('chat-title').textContent !== 'New chat'")
    conversation = await Conversation.objects.aget()
    assert conversation.title and conversation.title_generation_id is not None
    assert "\n" not in conversation.title and '"' not in conversation.title and len(conversation.title) <= 60
    # The title from the JSON the model was held to (the scripted engine writes a value of the schema).
    titling = await Generation.objects.aget(id=conversation.title_generation_id)
    assert conversation.title == json.loads(titling.text)["title"]
    assert await page.locator("#chat-title").text_content() == conversation.title
    assert await page.locator("#conversation-list a.conversation-link.active").text_content() == conversation.title
    assert await page.title() == conversation.title
    assert await page.locator("section[data-group=Today] a.conversation-link").count() == 1

    # Delete is there on the chat just started, without a reload, and asks first.
    assert await page.locator("#conversation-actions").is_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    await page.click("#delete-form button")
    await page.wait_for_selector("#empty")
    assert not await Conversation.objects.aexists()

    # A title the model could not finish (its JSON cut at the length limit): the question names the chat.
    monkeypatch.setattr(conversation_titles, "TITLE_MAX_TOKENS", 3)
    await page.fill("#input", "Plan a weekend in Lisbon")
    await page.keyboard.press("Enter")
    active = page.locator("#conversation-list a.conversation-link.active")
    await expect(active).to_have_text("Plan a weekend in Lisbon")
    await expect(page.locator("#chat-title")).to_have_text("Plan a weekend in Lisbon")
    retitled = await Conversation.objects.select_related("title_generation").aget()
    assert retitled.title_generation.finish_reason == "length"


async def test_rename_in_place_pin_and_search(page):
    await sign_in(page, "ivan")
    trip = await _chat("ivan", "Lisbon trip", "Where should we stay?", "Try Alfama.")
    await _chat("ivan", "Groceries", "milk and eggs")
    await page.goto(f"/c/{trip.id}/")

    # Esc cancels, Enter saves.
    await page.click("#rename")
    await page.fill("#chat-title input", "Never saved")
    await page.keyboard.press("Escape")
    assert await page.locator("#chat-title").text_content() == "Lisbon trip"
    await page.dblclick("#chat-title")
    await page.fill("#chat-title input", "Porto <b>trip</b>")
    await page.keyboard.press("Enter")
    await page.wait_for_function("() => document.title === 'Porto <b>trip</b>'")
    # The heading and the list are written once the server has taken the name.
    await expect(page.locator("#chat-title")).to_have_text("Porto <b>trip</b>")
    await expect(page.locator(f'a.conversation-link[data-conversation="{trip.id}"]')).to_have_text("Porto <b>trip</b>")
    assert await page.locator("#chat-title b, #conversation-list b").count() == 0
    assert (await Conversation.objects.aget(id=trip.id)).title == "Porto <b>trip</b>"

    # Pinned: on top of the list, and still there after a reload.
    await page.click("#pin")
    await page.wait_for_selector(f'section[data-group=Pinned] a[data-conversation="{trip.id}"]')
    assert await page.locator("#pin").text_content() == "Unpin"
    await page.reload()
    groups = await page.eval_on_selector_all("section.conversation-group", "s => s.map(g => g.dataset.group)")
    assert groups == ["Pinned", "Today"]

    # Search: titles and message text, as the words are typed.
    await page.fill("#conversation-search", "groc")
    await page.wait_for_function("() => document.querySelectorAll('a.conversation-link').length === 1")
    assert await page.locator("a.conversation-link").text_content() == "Groceries"
    await page.fill("#conversation-search", "alfama")
    await page.wait_for_function(
        f"() => document.querySelector('a.conversation-link')?.dataset.conversation === '{trip.id}'"
        " && document.querySelectorAll('a.conversation-link').length === 1"
    )
    await page.fill("#conversation-search", "nothing like this")
    await page.wait_for_selector("#no-results", state="visible")
    await page.fill("#conversation-search", "")
    await page.wait_for_function("() => document.querySelectorAll('a.conversation-link').length === 2")


async def test_a_shared_link_is_read_only_and_goes_away_when_revoked(page):
    await sign_in(page, "judy")
    chat = await _chat("judy", "Tulips", "Tell me about <i>tulips</i>", "They are flowers.")
    await page.goto(f"/c/{chat.id}/")
    await page.click("#share")
    await page.wait_for_selector("#share-panel", state="visible")
    url = await page.input_value("#share-url")

    stranger = await page.context.browser.new_context()
    shared = await stranger.new_page()
    response = await shared.goto(url)
    assert response.status == 200 and response.headers["x-robots-tag"].startswith("noindex")
    assert await shared.locator("#shared-title").text_content() == "Tulips"
    assert await shared.locator("article.message.user .content").text_content() == "Tell me about <i>tulips</i>"
    assert await shared.locator("#messages i, #conversation-list, #composer").count() == 0
    assert "judy" not in await shared.content()

    await page.click("#share-revoke")
    await page.wait_for_selector("#share-panel", state="hidden")
    assert (await shared.goto(url)).status == 404
    await stranger.close()


async def test_a_message_sent_in_one_tab_appears_in_the_other(page):
    await sign_in(page, "kim")
    await page.fill("#input", "Say hello.")
    await page.keyboard.press("Enter")
    await page.wait_for_selector(ANSWER_ENDED)
    other = await page.context.new_page()
    other.set_default_timeout(90_000)
    await other.goto(page.url)
    await other.wait_for_selector("#chat[data-socket=open]", state="attached")

    await page.fill("#input", "Name a fruit.")
    await page.keyboard.press("Enter")
    await other.wait_for_function(
        "() => Array.from(document.querySelectorAll('article.message.user .content')).some(c => c.textContent === 'Name a fruit.')"
    )
    # The other tab follows the answer to its end, and shows what was saved.
    await other.wait_for_function(
        "() => { const a = document.querySelectorAll('article.message.assistant');"
        " return a.length === 2 && ['complete', 'stopped', 'failed', 'flagged'].includes(a[1].dataset.status); }"
    )
    answer = await Message.objects.filter(role="assistant").alatest("created_at")
    assert await other.locator("article.message.assistant .content").last.evaluate(SOURCE) == answer.content
    assert await other.locator("article.message.user").count() == 2
