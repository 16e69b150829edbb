"""The sidebar's "…" menu on each chat, the Archived view, Select mode and copying a shared link, in
a real browser: on a desktop in the light theme and on a phone in the dark one."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from accounts.models import User, UserSettings
from conversations.models import Conversation, SharedConversation
from tests.browser.conftest import BROWSER_MARKS, sign_in
from tests.browser.test_branches import DESKTOP, PHONE
from tests.browser.test_content_security_policy import violations  # noqa: F401 (a fixture)
from tests.browser.test_conversation_list import _chat

pytestmark = BROWSER_MARKS

MENU = "#chat-menu"
WHITE = "rgb(255, 255, 255)"


def button_of(page, conversation: Conversation):
    return page.locator(f'button.chat-menu-button[data-conversation="{conversation.id}"]')


def link_of(page, conversation: Conversation):
    return page.locator(f'a.conversation-link[data-conversation="{conversation.id}"]')


async def focused_action(page) -> str | None:
    return await page.evaluate("() => document.activeElement.dataset.action || null")


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_the_chat_menu_archive_view_select_mode_and_copying_a_shared_link(page, viewport, theme, violations):  # noqa: F811
    phone = viewport == PHONE
    await page.set_viewport_size(viewport)
    await sign_in(page, "uma")
    await UserSettings.objects.aupdate_or_create(
        user=await User.objects.aget(username="uma"), defaults={"theme": theme}
    )
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    trip = await _chat("uma", "Lisbon trip", "Where should we stay?", "Try Alfama.")
    notes = await _chat("uma", "Notes", "Remember the milk")
    idea = await _chat("uma", "An idea")
    draft = await _chat("uma", "A draft")

    async def sidebar():
        if phone and not await page.locator("#layout.menu-open").count():
            await page.click("#menu-button")
        await page.wait_for_selector("#sidebar", state="visible")

    async def open_menu(conversation):
        await button_of(page, conversation).click()
        await page.wait_for_selector(MENU, state="visible")

    # The header's share panel: Copy says so, on the button and to a screen reader.
    await page.goto(f"/c/{trip.id}/")
    await page.click("#share")
    await page.wait_for_selector("#share-panel", state="visible")
    await page.click("#share-copy")
    await expect(page.locator("#share-copy")).to_have_text("Copied")
    await expect(page.locator("#announcer")).to_have_text("Link copied.")
    assert await page.evaluate("() => navigator.clipboard.readText()") == await page.input_value("#share-url")

    # A menu button on every chat: shown on hover on a desktop, always on a phone.
    await sidebar()
    assert await page.locator("button.chat-menu-button").count() == 4
    notes_button = button_of(page, notes)
    opacity = "b => getComputedStyle(b).opacity"
    if phone:
        assert await notes_button.evaluate(opacity) == "1"
    else:
        assert await notes_button.evaluate(opacity) == "0"
        await link_of(page, notes).hover()
        await expect(notes_button).to_have_css("opacity", "1")
    assert await notes_button.get_attribute("aria-label") == "Options for Notes"

    # Opened by the mouse: on its first item, inside the window, in the page's theme.
    await open_menu(notes)
    assert await notes_button.get_attribute("aria-expanded") == "true"
    assert await focused_action(page) == "rename"
    box = await page.locator(MENU).bounding_box()
    assert box["x"] >= 0 and box["y"] >= 0
    assert box["x"] + box["width"] <= viewport["width"] and box["y"] + box["height"] <= viewport["height"]
    background = await page.locator(MENU).evaluate("m => getComputedStyle(m).backgroundColor")
    assert (background == WHITE) == (theme == "light")
    actions = await page.eval_on_selector_all(f"{MENU} [role=menuitem]", "items => items.map(i => i.dataset.action)")
    # The projects' own item (static/chat/projects.js) sits before Archive and Delete, as added items do.
    assert actions == ["rename", "pin", "share", "export-markdown", "export-json", None, "archive", "delete"]
    # Esc closes it (and only it: the phone's drawer stays open), giving the focus back to its button.
    await page.keyboard.press("Escape")
    await page.wait_for_selector(MENU, state="hidden")
    assert await notes_button.get_attribute("aria-expanded") == "false"
    assert await page.evaluate("() => document.activeElement.matches('button.chat-menu-button')")
    await expect(page.locator("#sidebar")).to_be_visible()

    # By the keyboard: Enter and Space open it, the arrows move round it; a click outside closes it.
    await notes_button.focus()
    await page.keyboard.press("Enter")
    await page.wait_for_selector(MENU, state="visible")
    await page.keyboard.press("ArrowDown")
    assert await focused_action(page) == "pin"
    await page.keyboard.press("ArrowUp")
    await page.keyboard.press("ArrowUp")
    assert await focused_action(page) == "delete"
    await page.keyboard.press("Escape")
    await page.keyboard.press("Space")
    await page.wait_for_selector(MENU, state="visible")
    await page.click("#conversation-search")
    await page.wait_for_selector(MENU, state="hidden")

    # Rename in place, by the keyboard from the menu.
    await notes_button.focus()
    await page.keyboard.press("Enter")
    await page.keyboard.press("Enter")
    await page.wait_for_selector(f'a.conversation-link[data-conversation="{notes.id}"] input')
    await page.fill(f'a.conversation-link[data-conversation="{notes.id}"] input', "Shopping")
    await page.keyboard.press("Enter")
    await expect(link_of(page, notes)).to_have_text("Shopping")
    assert (await Conversation.objects.aget(id=notes.id)).title == "Shopping"
    await expect(notes_button).to_have_attribute("aria-label", "Options for Shopping")

    # Pin by the keyboard (the focus goes on with the chat's button in the list drawn anew), then Unpin.
    await notes_button.focus()
    await page.keyboard.press("Enter")
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("Enter")
    await page.wait_for_selector(f'section[data-group=Pinned] a[data-conversation="{notes.id}"]')
    assert (await Conversation.objects.aget(id=notes.id)).pinned
    await page.wait_for_function(
        f"() => document.activeElement.matches('button.chat-menu-button[data-conversation=\"{notes.id}\"]')"
    )
    await open_menu(notes)
    await expect(page.locator(f"{MENU} [data-action=pin]")).to_have_text("Unpin")
    await page.click(f"{MENU} [data-action=pin]")
    await page.wait_for_selector(f'section[data-group=Today] a[data-conversation="{notes.id}"]')
    assert await page.locator("section[data-group=Pinned]").count() == 0

    # Share a chat other than the one open: the link, and Copy says so.
    await open_menu(notes)
    await page.click(f"{MENU} [data-action=share]")
    await page.wait_for_selector("#share-dialog", state="visible")
    url = await page.input_value("#share-dialog-url")
    assert url.endswith(f"/s/{(await SharedConversation.objects.aget(conversation_id=notes.id)).token}/")
    await page.click("#share-dialog-copy")
    await expect(page.locator("#share-dialog-copied")).to_have_text("Copied")
    assert await page.evaluate("() => navigator.clipboard.readText()") == url
    await page.keyboard.press("Escape")
    await page.wait_for_selector("#share-dialog", state="hidden")

    # Export: the existing downloads.
    await open_menu(notes)
    async with page.expect_download() as download:
        await page.click(f"{MENU} [data-action=export-markdown]")
    assert (await download.value).suggested_filename == f"chat-{notes.id}-shopping.md"
    await open_menu(notes)
    href = await page.get_attribute(f"{MENU} [data-action=export-json]", "href")
    assert href == f"/c/{notes.id}/export.json"

    # Another script's item, before Archive and Delete.
    await page.keyboard.press("Escape")
    await page.evaluate(
        "() => window.chatMenu.addItem({label: 'Pin to desk', onSelect: (id) => { document.body.dataset.moved = id; }})"
    )
    await open_menu(notes)
    labels = await page.eval_on_selector_all(f"{MENU} [role=menuitem]", "items => items.map(i => i.textContent)")
    assert labels[-4:] == ["Move to project…", "Pin to desk", "Archive", "Delete"]
    await page.click(f"{MENU} [role=menuitem] >> text=Pin to desk")
    assert await page.evaluate("() => document.body.dataset.moved") == str(notes.id)
    # The projects' item opens the move dialog for that chat.
    await open_menu(notes)
    await page.click(f"{MENU} [role=menuitem] >> text=Move to project…")
    await page.wait_for_selector("#project-move-dialog")
    await page.keyboard.press("Escape")
    await page.wait_for_selector("#project-move-dialog", state="detached")

    # Archive two chats: out of the list; in the Archived view, one comes back and one is deleted.
    for chat in (notes, idea):
        await open_menu(chat)
        await page.click(f"{MENU} [data-action=archive]")
        await expect(link_of(page, chat)).to_have_count(0)
        # The focus moves on to another chat's button (or the search box), not to the page's start; the
        # list drawn anew after the archive takes the button with it for a moment, so this waits.
        await page.wait_for_function(
            "() => document.activeElement.matches('button.chat-menu-button, #conversation-search')"
        )
    assert await Conversation.objects.filter(archived_at__isnull=False).acount() == 2
    await page.click("#archived-link")
    dialog = page.locator("#archived-dialog")
    await expect(dialog).to_be_visible()
    await expect(dialog.locator("li")).to_have_count(2)
    dialog_box = await dialog.bounding_box()
    assert dialog_box["x"] >= 0 and dialog_box["x"] + dialog_box["width"] <= viewport["width"]
    page.once("dialog", lambda question: question.accept())
    await dialog.locator(f'li[data-conversation="{idea.id}"] [data-action=delete]').click()
    await expect(dialog.locator("li")).to_have_count(1)
    assert not await Conversation.objects.filter(id=idea.id).aexists()
    await dialog.locator(f'li[data-conversation="{notes.id}"] [data-action=unarchive]').click()
    await expect(page.locator("#archived-empty")).to_be_visible()
    await expect(link_of(page, notes)).to_have_count(1)
    assert (await Conversation.objects.aget(id=notes.id)).archived_at is None
    await page.click("#archived-dialog .chat-dialog-close")

    # Archiving the chat that is open leads to a new chat; it still opens from the Archived view.
    await open_menu(trip)
    await page.click(f"{MENU} [data-action=archive]")
    await page.wait_for_selector("#empty")
    await sidebar()
    await expect(link_of(page, trip)).to_have_count(0)
    await page.click("#archived-link")
    await page.click(f'#archived-dialog li[data-conversation="{trip.id}"] a')
    await page.wait_for_selector("article.message.assistant")
    assert await page.locator("#chat-title").text_content() == "Lisbon trip"
    await sidebar()
    await expect(link_of(page, trip)).to_have_count(0)

    # Select two chats and delete them together, once the question is answered yes.
    await page.click("#select-chats")
    await expect(page.locator("input.chat-select")).to_have_count(2)
    await page.check(f'input.chat-select[data-conversation="{notes.id}"]')
    await link_of(page, draft).click()  # a click on a chat ticks it while selecting
    await expect(page.locator("#selected-count")).to_have_text("2 selected")
    page.once("dialog", lambda question: question.dismiss())
    await page.click("#delete-selected")
    assert await Conversation.objects.acount() == 3
    page.once("dialog", lambda question: question.accept())
    await page.click("#delete-selected")
    await expect(page.locator("a.conversation-link")).to_have_count(0)
    assert [c.id async for c in Conversation.objects.all()] == [trip.id]
    await expect(page.locator("input.chat-select")).to_have_count(0)
    assert await page.get_attribute("#select-chats", "aria-pressed") == "false"
    assert violations == []  # placed, shown and hidden under the page's Content-Security-Policy


async def test_the_list_drawn_anew_keeps_the_focus_and_the_open_menu(page, violations):  # noqa: F811
    """The list is drawn anew whenever a search, another tab or a project move asks for it, at any
    moment: the focus and an open menu go on with the chat's new elements, never to the page's start."""
    await page.set_viewport_size(DESKTOP)
    await sign_in(page, "uma")
    trip = await _chat("uma", "Lisbon trip", "Where should we stay?", "Try Alfama.")
    notes = await _chat("uma", "Notes", "Remember the milk")
    idea = await _chat("uma", "An idea")
    await page.goto(f"/c/{trip.id}/")
    focused = "() => [document.activeElement.className, document.activeElement.dataset.conversation, !!document.activeElement.dataset.old]"

    # A focused menu button: the same chat's new button has the focus after the list is drawn anew.
    await button_of(page, notes).focus()
    await button_of(page, notes).evaluate("b => { b.dataset.old = '1'; }")
    await page.evaluate("() => window.chatMenu.refresh()")
    assert await page.evaluate(focused) == ["chat-menu-button", str(notes.id), False]
    # ... but a click elsewhere has left the list: a redraw then takes no focus back to it.
    await page.click("#chat-title")
    assert await page.evaluate("() => document.activeElement === document.body")
    await page.evaluate("() => window.chatMenu.refresh()")
    assert await page.evaluate("() => document.activeElement === document.body")

    # A menu open while the list is drawn anew: Esc gives the focus to the chat's new button.
    await button_of(page, idea).click()
    await page.wait_for_selector(MENU, state="visible")
    await page.evaluate("() => window.chatMenu.refresh()")
    await page.keyboard.press("Escape")
    assert await page.evaluate(focused) == ["chat-menu-button", str(idea.id), False]
    assert await button_of(page, idea).get_attribute("aria-expanded") == "false"

    # Archive from a menu open across a redraw: the focus moves on to the next chat's button.
    await button_of(page, idea).click()
    await page.wait_for_selector(MENU, state="visible")
    await page.evaluate("() => window.chatMenu.refresh()")
    await page.click(f"{MENU} [data-action=archive]")
    await expect(link_of(page, idea)).to_have_count(0)
    assert await page.evaluate(focused) == ["chat-menu-button", str(notes.id), False]
    # ... and stays there through the redraw the archive itself asks for.
    await page.evaluate("() => window.chatMenu.refresh()")
    assert await page.evaluate(focused) == ["chat-menu-button", str(notes.id), False]
