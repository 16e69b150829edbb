"""The chat page's settings, layout and behaviour in a real browser: the theme, the phone menu, the
composer, following a streaming answer, its accessibility, the keyboard, the API keys page.

No engine runs here: answers are queued and never dispatched, and each test streams them itself
with the same publisher a runner uses, so what the page does at each moment is the test's choice."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from accounts.models import ApiKey, User, UserSettings
from conversations.models import Conversation, Message
from inference.models import Generation
from inference.openai.wire import usage
from inference.services import generation_finish
from inference.streaming.streams import StreamPublisher
from tests.browser.conftest import CHROMIUM, sign_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
# The chat page's behaviour on a desktop in the light theme and on a phone in the dark one.
LOOKS = pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)


@pytest.fixture
def no_engine(monkeypatch):
    """Answers are queued and never run; a socket's connect starts no engine."""
    from inference.execution.dispatch import local_backend

    async def start() -> None:
        return None

    monkeypatch.setattr("inference.services.generation_dispatch", lambda **dispatch: None)
    monkeypatch.setattr(local_backend, "start", start)


@contextlib.asynccontextmanager
async def browser_page(chromium, url: str, viewport: dict[str, int]):
    context = await chromium.new_context(base_url=url, viewport=viewport)
    page = await context.new_page()
    page.set_default_timeout(20_000)
    page.base_url = url  # for `sign_in`'s cookie
    try:
        yield page
    finally:
        await context.close()


@pytest.fixture
async def page(chromium, server_without_engine, no_engine):
    async with browser_page(chromium, server_without_engine, DESKTOP) as page:
        yield page


@pytest.fixture
async def phone(chromium, server_without_engine, no_engine):
    async with browser_page(chromium, server_without_engine, PHONE) as page:
        yield page


async def sent(page, text: str) -> tuple[str, StreamPublisher]:
    """Send `text` from the page; its answer's generation id and a publisher to stream it with."""
    before = await page.locator("article.message.assistant").count()
    await page.fill("#input", text)
    await page.keyboard.press("Enter")
    handle = await page.wait_for_function(
        "(n) => { const a = document.querySelectorAll('article.message.assistant');"
        " return a.length > n && a[a.length - 1].dataset.generation; }",
        arg=before,
    )
    generation_id = await handle.json_value()
    return generation_id, StreamPublisher(generation_id, coalesce_ms=0)


async def finished(generation_id: str, publisher: StreamPublisher, text: str, finish_reason: str = "stop") -> None:
    await database_sync_to_async(generation_finish)(
        generation_id=generation_id, status=Generation.Status.COMPLETE, text=text, finish_reason=finish_reason
    )
    await publisher.finish(status="complete", finish_reason=finish_reason, usage=usage(1, 2))


@database_sync_to_async
def long_conversation(username: str, pairs: int = 30) -> Conversation:
    from inference.selectors import deployment_get

    user = User.objects.get(username=username)
    conversation = Conversation.objects.create(user=user, deployment=deployment_get(), title="A long talk")
    answer = None  # one branch: each question follows the answer before it
    for i in range(pairs):
        question = Message.objects.create(
            conversation=conversation, role="user", content=f"Question {i}?", status="complete", parent=answer
        )
        answer = Message.objects.create(
            conversation=conversation,
            role="assistant",
            content=f"Answer {i}. " + "Words. " * 40,
            status="complete",
            parent=question,
        )
    return conversation


async def signed_in_as(page, username: str, viewport: dict[str, int], theme: str) -> None:
    """`username` on the chat page at this size, in this theme (the setting, as the server renders it)."""
    await page.set_viewport_size(viewport)
    await sign_in(page, username)
    await UserSettings.objects.aupdate_or_create(
        user=await User.objects.aget(username=username), defaults={"theme": theme}
    )
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    assert await page.get_attribute("html", "data-theme") == theme


async def _within(page, selector: str, viewport: dict[str, int]) -> None:
    box = await page.locator(selector).bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], selector
    assert box["y"] >= 0 and box["y"] + box["height"] <= viewport["height"], selector


async def background(page, selector: str) -> str:
    return await page.locator(selector).evaluate("e => getComputedStyle(e).backgroundColor")


WHITE = "rgb(255, 255, 255)"
DANGER = {"light": "rgb(180, 35, 24)", "dark": "rgb(255, 138, 122)"}  # Stop, in each theme's --danger


async def scrolled_to_end(page) -> bool:
    return await page.evaluate(
        "() => { const m = document.getElementById('messages');"
        " return m.scrollHeight - m.scrollTop - m.clientHeight <= 48; }"
    )


# --- settings and theme ---------------------------------------------------------------------------


async def test_the_settings_page_is_linked_from_the_sidebar_and_its_dark_theme_is_on_the_next_page(page):
    await sign_in(page, "olga")
    await page.click("#settings-link")
    await page.fill("textarea[name=about_me]", "I grow tomatoes.")
    await page.check("input[name=theme][value=dark]")
    await page.click("button[type=submit]")
    await page.wait_for_selector("text=Settings saved.")
    assert await page.get_attribute("html", "data-theme") == "dark"
    await page.goto("/")
    # Rendered dark by the server: the first paint is dark, no script needed.
    assert await page.get_attribute("html", "data-theme") == "dark"
    background = await page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(22, 24, 28)"
    assert await page.locator("link[rel=icon][type='image/svg+xml']").count() == 1
    icon = await page.request.get(await page.get_attribute("link[rel=icon]", "href"))
    assert icon.ok and b"<svg" in await icon.body()


async def test_the_system_theme_follows_the_operating_systems_preference(page):
    await sign_in(page, "pavel")
    await page.emulate_media(color_scheme="dark")
    assert await page.evaluate("() => getComputedStyle(document.body).backgroundColor") == "rgb(22, 24, 28)"
    await page.emulate_media(color_scheme="light")
    assert await page.evaluate("() => getComputedStyle(document.body).backgroundColor") == "rgb(255, 255, 255)"


# --- phones ---------------------------------------------------------------------------------------


async def test_on_a_phone_the_menu_button_reaches_everything(phone):
    await sign_in(phone, "quinn")
    await long_conversation("quinn", pairs=2)
    await phone.reload()
    assert await phone.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    assert await phone.is_hidden("#conversation-list a")
    assert await phone.is_visible("#input") and await phone.is_visible("#send") and await phone.is_visible("#model")

    await phone.click("#menu-button")
    assert await phone.get_attribute("#menu-button", "aria-expanded") == "true"
    await phone.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    for selector in ("#new-chat", "#conversation-list a", "text=Usage", "text=API keys", "#settings-link", "#log-out"):
        item = phone.locator(selector).first
        await item.wait_for(state="visible")
        box = await item.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], selector
        assert box["y"] >= 0 and box["y"] + box["height"] <= PHONE["height"], selector
    assert await phone.evaluate("() => document.activeElement.id") == "new-chat"

    await phone.keyboard.press("Escape")
    await phone.wait_for_selector("#sidebar", state="hidden")
    assert await phone.evaluate("() => document.activeElement.id") == "menu-button"

    await phone.click("#menu-button")
    await phone.click("#conversation-list a")
    await phone.wait_for_url("**/c/*/")
    assert await phone.text_content("#chat-title") == "A long talk"
    # The conversation's own actions are all on screen too, not cut off at the header's edge.
    assert await phone.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    for selector in (
        "#rename",
        "#pin",
        "#share",
        "#export-markdown",
        "#export-json",
        "#export-tree",
        "#delete-form button",
        "#model",
    ):
        box = await phone.locator(selector).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], selector


# --- the composer, following an answer, accessibility ----------------------------------------------


@LOOKS
async def test_the_composer_grows_with_its_text_up_to_a_limit(page, viewport, theme):
    await signed_in_as(page, "rita", viewport, theme)
    assert await page.evaluate("() => document.activeElement.id") == "input"  # focused on load
    one_line = (await page.locator("#input").bounding_box())["height"]
    await page.fill("#input", "line\n" * 5)
    five_lines = (await page.locator("#input").bounding_box())["height"]
    assert five_lines > one_line * 2
    await page.fill("#input", "line\n" * 200)
    tall = (await page.locator("#input").bounding_box())["height"]
    assert tall <= viewport["height"] * 0.4 + 1
    assert (await background(page, "#input") == WHITE) == (theme == "light")
    assert await page.evaluate("() => getComputedStyle(document.getElementById('input')).overflowY") == "auto"


@LOOKS
async def test_a_long_conversation_opens_at_its_end_and_follows_an_answer_only_from_the_bottom(page, viewport, theme):
    await signed_in_as(page, "sam", viewport, theme)
    conversation = await long_conversation("sam")
    await page.goto(f"/c/{conversation.id}/")
    assert await scrolled_to_end(page)
    assert await page.get_attribute("#messages", "aria-live") is None  # no announcement per delta
    assert await page.get_attribute(f'#conversation-list a[data-conversation="{conversation.id}"]', "aria-current") == (
        "page"
    )

    generation_id, publisher = await sent(page, "Tell me more.")
    answer = page.locator("article.message.assistant").last
    assert await answer.get_attribute("aria-busy") == "true"
    for i in range(5):
        await publisher.add_text(f"Line {i}.\n" * 3)
    await page.wait_for_function(
        "() => document.querySelector('article.message.assistant:last-of-type .content')"
        ".textContent.includes('Line 4.')"
    )
    assert await scrolled_to_end(page)  # at the bottom: it follows

    await page.mouse.move(viewport["width"] // 2, 300)
    await page.mouse.wheel(0, -1500)  # the reader scrolls up to read
    await page.wait_for_function(
        "() => { const m = document.getElementById('messages');"
        " return m.scrollHeight - m.scrollTop - m.clientHeight > 1000; }"
    )
    await asyncio.sleep(0.3)  # the wheel's scrolling has settled
    reading_at = await page.evaluate("() => document.getElementById('messages').scrollTop")
    for i in range(5, 10):
        await publisher.add_text(f"Line {i}.\n" * 3)
    await page.wait_for_selector("#jump-latest", state="visible")
    assert not await scrolled_to_end(page)  # left where they are reading
    assert await page.evaluate("() => document.getElementById('messages').scrollTop") == reading_at

    await _within(page, "#jump-latest", viewport)
    assert (await background(page, "#jump-latest") == WHITE) == (theme == "light")
    await page.click("#jump-latest")
    assert await scrolled_to_end(page)
    assert await page.is_hidden("#jump-latest")

    await finished(generation_id, publisher, "done")
    # The answer being written, not one of the conversation's earlier ones.
    await page.wait_for_selector("article.message.assistant:last-of-type.status-complete")
    assert await answer.get_attribute("aria-busy") is None
    await page.wait_for_function("() => document.getElementById('announcer').textContent === 'The answer is complete.'")
    assert await page.get_attribute("#announcer", "role") == "status"
    assert await page.get_attribute("#request-error", "role") == "alert"
    assert await page.get_attribute("#connection-status", "role") == "status"
    labels = await page.eval_on_selector_all("nav", "navs => navs.map(n => n.getAttribute('aria-label'))")
    assert labels == ["Projects", "Conversations", "Account"]


async def test_the_page_notices_an_answer_that_ended_without_an_event_within_seconds(page, settings):
    """Its end never reaches the page (here: recorded in the database, announced nowhere, and the
    socket's own quiet-stream round far off): the page asks again after a few quiet seconds and
    shows the end the server reads from the row."""
    settings.INFERENCE_STREAM_RESYNC_S = 600
    await sign_in(page, "tara")
    generation_id, publisher = await sent(page, "Say hello.")
    await publisher.add_text("Hel")
    await page.wait_for_selector("article.message.assistant.status-streaming")
    await Generation.objects.filter(id=generation_id).aupdate(
        status=Generation.Status.FAILED, text="Hel", error_code="worker_lost", error_message="The server stopped."
    )
    started = asyncio.get_running_loop().time()
    await page.wait_for_selector("article.message.assistant.status-failed", timeout=10_000)
    assert asyncio.get_running_loop().time() - started < 10
    assert "This answer failed: The server stopped." in await page.text_content("article.message.assistant")
    assert await page.is_visible("#send") and await page.is_visible("button.regenerate")


async def test_regenerate_is_not_left_on_an_older_answer_and_its_error_goes_with_the_next_try(page):
    await sign_in(page, "uma")
    generation_id, publisher = await sent(page, "First question")
    await finished(generation_id, publisher, "First answer")
    await page.wait_for_selector("button.regenerate")

    generation_id, publisher = await sent(page, "Second question")
    assert await page.locator("button.regenerate").count() == 0  # not on the older answer meanwhile
    await finished(generation_id, publisher, "Second answer")
    await page.wait_for_selector("article.message.assistant:last-of-type button.regenerate")
    assert await page.locator("button.regenerate").count() == 1

    # Another tab has an answer being written: the regenerate is refused, and says why.
    user = await User.objects.aget(username="uma")
    conversation = await Conversation.objects.aget(user=user)
    extra = await Message.objects.acreate(conversation=conversation, role="assistant", status="streaming")
    await page.click("button.regenerate")
    await page.wait_for_selector("#request-error:not([hidden])")
    await extra.adelete()
    await page.click("button.regenerate")
    assert await page.is_hidden("#request-error")  # the stale error goes as the new try begins
    await page.wait_for_selector("article.message.assistant:last-of-type[data-status=pending]")


async def test_the_keyboard_stops_an_answer_with_escape_and_starts_a_new_chat(page):
    await sign_in(page, "vera")
    generation_id, publisher = await sent(page, "Write a long story.")
    await publisher.add_text("Once upon a time")
    await page.wait_for_selector("article.message.assistant.status-streaming")
    await page.keyboard.press("Escape")
    await page.wait_for_selector("article.message.assistant.status-stopped")
    assert (await Generation.objects.aget(id=generation_id)).status == Generation.Status.STOPPED

    assert "/c/" in page.url
    await page.keyboard.press("Control+Shift+O")
    await page.wait_for_function("() => !location.pathname.startsWith('/c/')")
    assert await page.text_content("#chat-title") == "New chat"


async def test_the_model_picker_is_on_every_conversation(page):
    await sign_in(page, "wren")
    conversation = await long_conversation("wren", pairs=1)
    await page.goto(f"/c/{conversation.id}/")
    assert await page.is_enabled("#model")
    assert await page.input_value("#model") == conversation.deployment.name


# --- the API keys page ------------------------------------------------------------------------------


async def test_a_new_key_is_shown_once_with_a_copy_button_and_a_reload_makes_no_second(page):
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await sign_in(page, "xena")
    await page.goto("/accounts/keys/")
    await page.fill("input[name=name]", "laptop")
    assert await page.is_checked("input[name=scopes][value='models:read']")
    await page.click("text=Create key")
    key = (await page.text_content("#new-key")).strip()
    assert key.startswith("cs_")
    await page.click("#copy-key")
    await page.wait_for_selector("text=Copied.")
    assert await page.evaluate("() => navigator.clipboard.readText()") == key

    await page.reload()
    assert await page.locator("#new-key").count() == 0
    assert await ApiKey.objects.acount() == 1


# --- Regenerate and Continue while the server takes its time, a refused message, an edit ---------


class Gate:
    """Holds the socket's regenerates and continues until `release` is set; then carries them out,
    or refuses them with `refusal` when it is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.refusal: str | None = None


@pytest.fixture
async def held_answers(monkeypatch):
    from chatsite.errors import ClientError
    from conversations.consumers import ChatConsumer

    gate = Gate()
    for name in ("_message_regenerate", "_message_continue"):
        carry_out = getattr(ChatConsumer, name)

        async def held(self, content, carry_out=carry_out):
            await gate.release.wait()
            if gate.refusal is not None:
                raise ClientError(gate.refusal, code="rate_limited", status=429)
            await carry_out(self, content)

        monkeypatch.setattr(ChatConsumer, name, held)
    yield gate
    gate.release.set()  # nothing is left waiting on a failed test's gate


async def idle(page) -> bool:
    return await page.is_visible("#send") and await page.is_hidden("#stop")


@LOOKS
@pytest.mark.parametrize("action", ["regenerate", "continue"])
async def test_regenerate_and_continue_are_busy_from_the_click_and_idle_again_when_refused(
    page, held_answers, action, viewport, theme
):
    await signed_in_as(page, "yusuf", viewport, theme)
    generation_id, publisher = await sent(page, "Tell a story.")
    await finished(generation_id, publisher, "Once upon a time", finish_reason="length")
    button = page.locator(f"article.message.assistant button.{action}")
    await button.wait_for()
    assert await idle(page)

    # Refused, after a while: busy at once (Stop shown, Enter keeps the text), idle again after.
    held_answers.refusal = "Too many requests. Try again in a minute."
    await button.click()
    await page.wait_for_selector("#stop", state="visible", timeout=2_000)
    assert await page.is_hidden("#send")
    assert await background(page, "#stop") == DANGER[theme]
    await _within(page, "#stop", viewport)
    assert await page.locator("article.message.assistant button.continue, button.regenerate").count() == 0
    await page.fill("#input", "And then?")
    await page.keyboard.press("Enter")
    assert await page.input_value("#input") == "And then?"  # as while an answer is written
    assert await page.locator("article.message.user").count() == 1
    held_answers.release.set()
    await page.wait_for_selector("#request-error:not([hidden])")
    assert "Too many requests" in await page.text_content("#request-error")
    await page.wait_for_selector("#send", state="visible")
    assert await idle(page)
    await button.wait_for()

    # Carried out, after a while, with Esc pressed meanwhile: the answer is stopped as it begins.
    held_answers.release.clear()
    held_answers.refusal = None
    await button.click()
    await page.wait_for_selector("#stop", state="visible", timeout=2_000)
    await page.keyboard.press("Escape")
    held_answers.release.set()
    await page.wait_for_selector("article.message.assistant.status-stopped")
    await page.wait_for_selector("#send", state="visible")
    newest = await Generation.objects.alatest("created_at")
    assert str(newest.id) != generation_id and newest.status == Generation.Status.STOPPED
    assert await Generation.objects.acount() == 2
    await page.focus("#input")
    await page.keyboard.press("Enter")  # the text kept in the composer goes now
    await page.wait_for_function("() => document.querySelectorAll('article.message.user').length === 2")
    assert await page.input_value("#input") == ""


@LOOKS
async def test_a_refused_message_comes_back_to_a_composer_that_fits_it_and_the_empty_chat_says_so(
    chromium, server_without_engine, no_engine, settings, viewport, theme
):
    settings.CHAT_MAX_MESSAGE_CHARS = 200
    async with browser_page(chromium, server_without_engine, viewport) as page:
        await signed_in_as(page, "zelda", viewport, theme)
        one_line = (await page.locator("#input").bounding_box())["height"]
        text = "\n".join(f"Line {i} of a message that is too long." for i in range(12))
        await page.fill("#input", text)
        await page.keyboard.press("Enter")
        await page.wait_for_selector("#request-error:not([hidden])")
        assert await page.input_value("#input") == text
        assert (await page.locator("#input").bounding_box())["height"] > one_line * 3
        assert await page.locator("article.message").count() == 0
        assert await page.is_visible("#empty")
        assert await page.text_content("#empty") == "Ask anything."
        assert await idle(page)


@LOOKS
async def test_no_jump_to_latest_after_an_edit_that_leaves_the_whole_chat_on_screen(
    chromium, server_without_engine, no_engine, viewport, theme
):
    async with browser_page(chromium, server_without_engine, viewport) as page:
        await signed_in_as(page, "abel", viewport, theme)
        conversation = await long_conversation("abel", pairs=6)
        await page.goto(f"/c/{conversation.id}/")
        await page.evaluate("() => { document.getElementById('messages').scrollTop = 0; }")
        await page.wait_for_function("() => document.getElementById('messages').scrollTop === 0")
        question = page.locator("article.message.user").first
        await question.locator("button.edit").click()
        await question.locator(".edit-form textarea").fill("Question 0, asked again?")
        assert await page.is_hidden("#jump-latest")  # an edit form opened is nothing new below
        await question.locator(".edit-form button.edit-send").click()
        await page.wait_for_function(
            "() => document.querySelectorAll('article.message').length === 2"
            " && document.querySelector('article.message.assistant').dataset.generation"
        )
        assert await page.evaluate(
            "() => { const m = document.getElementById('messages'); return m.scrollHeight <= m.clientHeight; }"
        )
        assert await page.is_hidden("#jump-latest")
