"""The composer and the keyboard on the chat page: the prompt library behind `/`, ↑ to edit the last
message, the shortcuts dialog on Ctrl+/, and when each message was written, on a desktop in the light
theme and on a phone in the dark one."""

from __future__ import annotations

import re

import pytest

from accounts.models import User, UserSettings
from conversations.models import SavedPrompt
from tests.browser.conftest import BROWSER_MARKS, sign_in

pytestmark = [*BROWSER_MARKS, pytest.mark.usefixtures("short_answers")]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
LIGHT_CARD = "rgb(255, 255, 255)"


async def _answered(page, count: int) -> None:
    await page.wait_for_function(
        "(count) => { const a = document.querySelectorAll('article.message.assistant');"
        " return a.length === count && ['complete', 'failed', 'flagged'].includes(a[a.length - 1].dataset.status)"
        " && document.getElementById('stop').hidden; }",
        arg=count,
    )


async def _within(page, selector: str, viewport: dict[str, int]) -> None:
    box = await page.locator(selector).bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], selector
    assert box["y"] >= 0 and box["y"] + box["height"] <= viewport["height"], selector


async def _timestamps_shown(page) -> None:
    times = page.locator("article.message > time.message-time")
    assert await times.count() == await page.locator("article.message").count()
    for i in range(await times.count()):
        time = times.nth(i)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d.*", await time.get_attribute("datetime"))
        assert re.search(r"\d{1,2}[:.]\d\d", await time.text_content())  # a short local time
        assert re.search(r"20\d\d", await time.get_attribute("title"))  # the full date on hover


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_saved_prompts_the_keyboard_and_timestamps_in_the_composer(page, viewport, theme):
    await page.set_viewport_size(viewport)
    await sign_in(page, "petra")
    await UserSettings.objects.aupdate_or_create(
        user=await User.objects.aget(username="petra"), defaults={"theme": theme}
    )

    # The library's page, linked from the sidebar's account links: two prompts saved, one refused.
    await page.goto("/prompts/")
    for command, text in (("/summarize", "Summarize this in one line:"), ("translate", "Translate into French:")):
        await page.fill("#prompt-new input[name=command]", command)
        await page.fill("#prompt-new textarea[name=text]", text)
        await page.click("#prompt-new button[type=submit]")
        await page.wait_for_selector(f"#prompt-list code:text-is('/{command.lstrip('/')}')")
    await page.fill("#prompt-new input[name=command]", "two words")
    await page.fill("#prompt-new textarea[name=text]", "x")
    await page.click("#prompt-new button[type=submit]")
    assert "lower-case letters" in await page.locator("#prompt-error").text_content()
    assert await SavedPrompt.objects.acount() == 2
    await page.goto("/")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    assert await page.get_attribute("#prompts-link", "href") == "/prompts/"

    # `/` opens the list, filtered as one types; Esc closes it and leaves the text.
    menu = page.locator("#prompt-menu")
    options = menu.locator("[role=option]")
    await page.focus("#input")
    await page.keyboard.type("/")
    await menu.wait_for()
    assert await menu.get_attribute("role") == "listbox"
    assert await options.all_text_contents() == [
        "/summarizeSummarize this in one line:",
        "/translateTranslate into French:",
    ]
    assert await options.first.get_attribute("aria-selected") == "true"
    await _within(page, "#prompt-menu", viewport)
    background = await menu.evaluate("m => getComputedStyle(m).backgroundColor")
    assert (background == LIGHT_CARD) == (theme == "light"), background
    await page.keyboard.type("tr")
    await page.wait_for_function("() => document.querySelectorAll('#prompt-menu [role=option]').length === 1")
    await page.keyboard.press("Escape")
    await menu.wait_for(state="hidden")
    assert await page.input_value("#input") == "/tr"

    # ↓ and Enter insert the second prompt's text, sending nothing; Tab inserts as well.
    await page.fill("#input", "")
    await page.keyboard.type("/")
    await menu.wait_for()
    await page.keyboard.press("ArrowDown")
    second = options.nth(1)
    assert await second.get_attribute("aria-selected") == "true"
    assert await page.get_attribute("#input", "aria-activedescendant") == await second.get_attribute("id")
    await page.keyboard.press("Enter")
    await menu.wait_for(state="hidden")
    assert await page.input_value("#input") == "Translate into French:"
    assert await page.locator("article.message").count() == 0
    await page.fill("#input", "")
    await page.keyboard.type("/SUM")
    await options.first.wait_for()
    await page.keyboard.press("Tab")
    assert await page.input_value("#input") == "Summarize this in one line:"
    assert await page.evaluate("() => document.activeElement.id") == "input"

    # Sent: each message says when it was written, live and after a reload.
    await page.keyboard.type(" The tide came in.")
    await page.keyboard.press("Enter")
    await _answered(page, 1)
    await _timestamps_shown(page)
    live = await page.locator("article.message.user time").get_attribute("datetime")
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    await _timestamps_shown(page)
    assert live[:16] == (await page.locator("article.message.user time").get_attribute("datetime"))[:16]

    # ↑ in the empty composer edits the last message, in the same form as its Edit button.
    await page.focus("#input")
    await page.keyboard.press("ArrowUp")
    area = page.locator("article.message.user .edit-form textarea")
    await area.wait_for()
    assert await area.input_value() == "Summarize this in one line: The tide came in."
    assert await page.evaluate("() => document.activeElement.getAttribute('aria-label')") == "Edit message"
    await area.fill("Summarize: the tide went out.")
    await page.click("article.message.user .edit-form button.edit-send")
    await _answered(page, 1)
    assert await page.locator("article.message.user .branch-position").text_content() == "2 / 2"
    # A regenerated answer, in the old one's place, shows its own time.
    answer_time = page.locator("article.message.assistant time.message-time")
    before = await answer_time.get_attribute("datetime")
    old_generation = await page.locator("article.message.assistant").get_attribute("data-generation")
    await page.click("article.message.assistant button.regenerate")
    await page.wait_for_function(
        "(old) => { const a = document.querySelector('article.message.assistant');"
        " return a.dataset.generation !== old && a.dataset.status === 'complete'"
        " && document.getElementById('stop').hidden; }",
        arg=old_generation,
    )
    assert await answer_time.get_attribute("datetime") > before
    await page.fill("#input", "Not empty")
    await page.keyboard.press("ArrowUp")  # only from an empty composer
    assert await page.locator(".edit-form").count() == 0

    # Ctrl+/ lists the shortcuts; Esc closes the list.
    dialog = page.locator("dialog#shortcuts")
    await page.keyboard.press("Control+/")
    await dialog.wait_for()
    text = await dialog.text_content()
    for shortcut in (
        "Keyboard shortcuts",
        "Start a new chat",
        "Stop the answer",
        "edit your last message",
        "saved prompt",
    ):
        assert shortcut in text
    assert "Ctrl" in text  # not a Mac
    await _within(page, "dialog#shortcuts", viewport)
    assert (await dialog.evaluate("d => getComputedStyle(d).backgroundColor") == LIGHT_CARD) == (theme == "light")
    await page.keyboard.press("Escape")
    await dialog.wait_for(state="hidden")
    assert await page.evaluate("() => document.activeElement.id") == "input"
