"""Screenshots of the chat page for the README: desktop light, desktop dark, phone (menu open too).

Skipped in a normal run: `make screenshots` (CHATSITE_SCREENSHOTS=1) writes them into
docs/screenshots/. The conversation is made in the database, so the pictures do not depend on what
the small default model happens to say, and no engine is needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from accounts.models import User, UserSettings
from conversations.models import Conversation, Message, Project
from tests.browser.conftest import CHROMIUM, sign_up
from tests.browser.test_settings_and_layout import DESKTOP, PHONE, browser_page, no_engine  # noqa: F401

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.screenshots,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
    pytest.mark.skipif(os.environ.get("CHATSITE_SCREENSHOTS") != "1", reason="make screenshots takes them"),
]

TALK = [
    (
        "What is a good first houseplant?",
        "A pothos is hard to beat: it tolerates low light, forgives a missed watering "
        "and grows fast enough to be rewarding.\n\nWater it when the top few centimetres of soil are dry, and keep it "
        "out of direct afternoon sun.",
    ),
    (
        "And one for a sunny windowsill?",
        "Try a jade plant or an aloe. Both are succulents: they like bright light, "
        "very little water, and a pot with a drainage hole.",
    ),
]


@database_sync_to_async
def a_conversation(username: str) -> Conversation:
    from inference.selectors import deployment_get

    user = User.objects.get(username=username)
    for title in ("Sourdough starter schedule", "Trip ideas for a rainy weekend", "Explain recursion simply"):
        Conversation.objects.create(user=user, deployment=deployment_get(), title=title)
    garden = Project.objects.create(owner=user, name="Garden", instructions="I garden on a north-facing balcony.")
    Conversation.objects.create(user=user, deployment=deployment_get(), title="Balcony tomatoes", project=garden)
    conversation = Conversation.objects.create(
        user=user, deployment=deployment_get(), title="Houseplants for beginners"
    )
    parent = None  # one branch: each question follows the answer before it
    for question, answer in TALK:
        parent = Message.objects.create(
            conversation=conversation, role="user", content=question, status="complete", parent=parent
        )
        parent = Message.objects.create(
            conversation=conversation, role="assistant", content=answer, status="complete", parent=parent
        )
    return conversation


async def test_take_the_readme_screenshots(chromium, server_without_engine, no_engine, monkeypatch):  # noqa: F811
    # As a served page looks once its model has loaded: no "The model is loading" banner.
    monkeypatch.setattr("conversations.views.engine_state", lambda deployment: "ready")
    monkeypatch.setattr("conversations.consumers.engine_state", lambda deployment: "ready")
    OUT.mkdir(parents=True, exist_ok=True)
    async with browser_page(chromium, server_without_engine, DESKTOP) as page:
        await sign_up(page, "demo")
        conversation = await a_conversation("demo")
        await page.goto(f"/c/{conversation.id}/")
        await page.screenshot(path=str(OUT / "chat-light.png"))
        await UserSettings.objects.aupdate_or_create(
            user=await User.objects.aget(username="demo"), defaults={"theme": "dark"}
        )
        await page.reload()
        await page.screenshot(path=str(OUT / "chat-dark.png"))
        await UserSettings.objects.filter(user__username="demo").aupdate(theme="light")
        await page.set_viewport_size(PHONE)
        await page.reload()
        await page.screenshot(path=str(OUT / "chat-phone.png"))
        await page.click("#menu-button")
        await page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().left >= 0")
        await page.screenshot(path=str(OUT / "chat-phone-menu.png"))
