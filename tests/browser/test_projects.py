"""Projects on the chat page, in a real browser: a new project with instructions and a file, a chat
started on its page (its prompt carries both), its chats under it in the sidebar, a chat moved in and
out from the chat page, and deleting a project each way."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from accounts.models import User, UserSettings
from conversations.models import Conversation, Project
from conversations.services import conversation_create, project_create
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.engine.tokenizers import tokenizer_for
from inference.models import Generation
from tests.browser.conftest import BROWSER_MARKS, sign_in

pytestmark = [*BROWSER_MARKS, pytest.mark.usefixtures("short_answers")]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
INSTRUCTIONS = "Answer as a ship's log: short dated entries."
FACT = "The harbour master of Port Aldwin in 1903 was Eliza Quennell, who kept the tide tables."
WHITE = "rgb(255, 255, 255)"


@pytest.fixture(autouse=True)
def processed_in_this_process(settings):
    settings.DOCUMENTS_PROCESSING = "thread"  # no documents worker runs for the test's server


async def _menu(page, phone: bool) -> None:
    """On a phone the sidebar is a drawer: open it."""
    if phone and await page.get_attribute("#menu-button", "aria-expanded") != "true":
        await page.click("#menu-button")


async def _move(page, phone: bool, choice: str) -> None:
    await page.click("#move-project")
    dialog = page.locator("#project-move-dialog")
    await dialog.wait_for()
    box = await dialog.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= (390 if phone else 1280), "the dialog fits the screen"
    await dialog.locator("select").select_option(label=choice)
    await dialog.locator("button[type=submit]").click()
    await dialog.wait_for(state="detached")


def _prompt_text(generation: Generation) -> str:
    tokenizer = tokenizer_for(str(settings.INFERENCE_MODELS_DIR / DEFAULT_DEPLOYMENT_FIELDS["model"]))
    return tokenizer.decode(generation.prompt_token_ids)


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_a_project_from_its_creation_to_its_deletion(page, viewport, theme):
    phone = viewport is PHONE
    await page.set_viewport_size(viewport)
    await sign_in(page, "pia")
    pia = await User.objects.aget(username="pia")
    await UserSettings.objects.aupdate_or_create(user=pia, defaults={"theme": theme})
    loose = await database_sync_to_async(conversation_create)(user=pia, title="Loose chat")
    await page.reload()

    # A new project, from the sidebar: its page opens.
    await _menu(page, phone)
    await page.click("#new-project")
    dialog = page.locator("#project-new-dialog")
    background = await dialog.evaluate("d => getComputedStyle(d).backgroundColor")
    assert (background == WHITE) == (theme == "light"), "the dialog follows the theme"
    await dialog.locator("input").fill("Voyage")
    await dialog.locator("button[type=submit]").click()
    await page.wait_for_url(re.compile(r"/p/\d+/$"))
    project = await Project.objects.aget(owner=pia)
    assert await page.text_content("#chat-title") == "New chat in Voyage"

    # Its instructions and a file, from its settings.
    await page.click("#project-settings summary")
    await page.fill("#project-instructions", INSTRUCTIONS)
    await page.click("#project-save")
    await page.wait_for_selector("#project-saved >> text=Saved")
    await page.set_input_files(
        "#project-file",
        files=[{"name": "harbour.md", "mimeType": "text/markdown", "buffer": f"# Harbour\n\n{FACT}\n".encode()}],
    )
    await page.wait_for_selector('#project-files li[data-status="ready"]', timeout=120_000)
    assert await page.text_content("#project-files .file-name") == "harbour.md"

    # A chat started on its page is in the project, and its prompt carries the instructions and the file.
    await page.fill("#input", "Who was the harbour master of Port Aldwin?")
    await page.keyboard.press("Enter")
    await page.wait_for_selector("article.message.assistant[data-status=complete]")
    started = await Conversation.objects.exclude(id=loose.id).aget()
    assert started.project_id == project.id
    generation = await Generation.objects.aget(message__conversation=started)
    prompt = await database_sync_to_async(_prompt_text)(generation)
    assert INSTRUCTIONS in prompt and FACT in prompt
    assert await page.locator("#project-page").is_hidden()
    in_project = f'details.project[data-project="{project.id}"] a.project-chat[data-conversation="{started.id}"]'
    await page.wait_for_selector(in_project, state="attached")
    assert await page.locator(f'#conversation-list a[data-conversation="{started.id}"]').count() == 0
    await page.reload()  # the server's sidebar says the same
    await page.wait_for_selector(in_project, state="attached")
    assert await page.locator(f'#conversation-list a[data-conversation="{started.id}"]').count() == 0
    assert await page.text_content("#chat-project") == "Voyage"

    # A chat moved in, then out, from its page's actions.
    await page.goto(f"/c/{loose.id}/")
    await _move(page, phone, "Voyage")
    await page.wait_for_selector("#chat-project >> text=Voyage")
    assert (await Conversation.objects.aget(id=loose.id)).project_id == project.id
    moved = f'details.project[data-project="{project.id}"] a.project-chat[data-conversation="{loose.id}"]'
    await page.wait_for_selector(moved, state="attached")
    assert await page.locator(f'#conversation-list a[data-conversation="{loose.id}"]').count() == 0
    await _move(page, phone, "No project")
    await page.wait_for_selector("#chat-project", state="detached")
    assert (await Conversation.objects.aget(id=loose.id)).project_id is None
    await page.wait_for_selector(f'#conversation-list a[data-conversation="{loose.id}"]', state="attached")
    assert await page.locator(moved).count() == 0

    # Deleting asks what becomes of its chats: no choice, nothing happens; "keep" keeps them.
    await page.goto(f"/p/{project.id}/")
    await page.click("#project-settings summary")
    await page.click("#project-delete-button")
    assert await Project.objects.filter(id=project.id).aexists()
    await page.check("#project-delete input[value=keep]")
    await page.click("#project-delete-button")
    await page.wait_for_url(lambda url: urlsplit(url).path == "/")
    assert not await Project.objects.filter(id=project.id).aexists()
    assert (await Conversation.objects.aget(id=started.id)).project_id is None
    await page.wait_for_selector(f'#conversation-list a[data-conversation="{started.id}"]', state="attached")

    # "delete" takes them with it.
    doomed = await database_sync_to_async(project_create)(owner=pia, name="Doomed")
    chat = await database_sync_to_async(conversation_create)(user=pia, title="Goes too", project_id=doomed.id)
    await page.goto(f"/p/{doomed.id}/")
    assert await page.text_content("#project-chats a") == "Goes too"
    await page.click("#project-settings summary")
    await page.check("#project-delete input[value=delete]")
    await page.click("#project-delete-button")
    await page.wait_for_url(lambda url: urlsplit(url).path == "/")
    assert not await Conversation.objects.filter(id=chat.id).aexists()
    assert await page.locator("details.project").count() == 0
