"""An answer regenerated with another model, and a conversation's own settings, on the chat page: the
model that wrote each answer said under it, live and after a reload; the settings panel saving,
keeping its values over a reload, and showing the server's refusal of a value out of bounds."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from accounts.models import Tier, User, UserSettings
from conversations.models import Conversation
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.models import ModelDeployment
from inference.selectors import deployment_cache_clear
from tests.browser.conftest import BROWSER_MARKS, sign_in
from tests.helpers.engines import SCRIPTED_DEFAULT

# About what is around the answers, not what they say.
pytestmark = [*BROWSER_MARKS, pytest.mark.usefixtures("short_answers")]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
WHITE = "rgb(255, 255, 255)"


async def _answered_anew(page, old_generation: str) -> None:
    await page.wait_for_function(
        "(old) => { const a = [...document.querySelectorAll('article.message.assistant')].pop();"
        " return a && a.dataset.generation && a.dataset.generation !== old"
        " && ['complete', 'failed', 'flagged'].includes(a.dataset.status) && document.getElementById('stop').hidden; }",
        arg=old_generation,
    )


async def _within(page, locator, viewport) -> None:
    box = await locator.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], box


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_an_answer_regenerated_by_another_model_and_the_chats_own_settings(page, viewport, theme):
    second = await ModelDeployment.objects.acreate(name="smollm2-second", **DEFAULT_DEPLOYMENT_FIELDS)
    await (await Tier.objects.aget(name="free")).deployments.aadd(second)
    deployment_cache_clear()
    await page.set_viewport_size(viewport)
    await sign_in(page, "walt")
    await UserSettings.objects.aupdate_or_create(
        user=await User.objects.aget(username="walt"), defaults={"theme": theme}
    )
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")

    await page.fill("#input", "Say hi.")
    await page.keyboard.press("Enter")
    await _answered_anew(page, "")
    answer = page.locator("article.message.assistant").last
    await expect(answer.locator(".answered-by")).to_have_text(f"Answered by {SCRIPTED_DEFAULT}")
    first_generation = await answer.get_attribute("data-generation")

    # Beside Regenerate, the models of the composer's picker; choosing one regenerates with it.
    picker = answer.locator("select.regenerate-model")
    assert await picker.locator("option[value=smollm2-second]").count() == 1
    await _within(page, picker, viewport)
    await picker.select_option("smollm2-second")
    await _answered_anew(page, first_generation)
    answer = page.locator("article.message.assistant").last
    await expect(answer.locator(".answered-by")).to_have_text(f"Answered by {second.answer_model}")
    assert await answer.locator(".answered-by").count() == 1
    assert await answer.get_attribute("data-siblings") and "," in await answer.get_attribute("data-siblings")

    await page.reload()
    answer = page.locator("article.message.assistant").last
    await expect(answer.locator(".answered-by")).to_have_text(f"Answered by {second.answer_model}")
    # The conversation stays on its model: the composer's picker, and the next send, are the default's.
    conversation = await Conversation.objects.select_related("deployment").aget()
    assert conversation.deployment.name != second.name
    assert await page.input_value("#model") == conversation.model

    # The chat's own settings: saved, kept over a reload, and a value out of bounds refused as it is.
    panel = page.locator("#conversation-settings-panel")
    await page.click("#conversation-settings")
    await expect(page.locator("#conversation-settings-limits")).to_contain_text("up to 1000 characters")
    await page.fill("#conversation-system-prompt", "Answer as a pirate.")
    await page.fill("#conversation-temperature", "1.5")
    await page.click("#conversation-settings-save")
    await expect(page.locator("#conversation-settings-saved")).to_have_text("Saved.")
    await _within(page, panel, viewport)
    background = await page.locator("#conversation-system-prompt").evaluate("e => getComputedStyle(e).backgroundColor")
    assert (background == WHITE) == (theme == "light")

    await page.reload()
    await page.click("#conversation-settings")
    await expect(page.locator("#conversation-system-prompt")).to_have_value("Answer as a pirate.")
    await expect(page.locator("#conversation-temperature")).to_have_value("1.5")
    await page.fill("#conversation-temperature", "3")
    await page.click("#conversation-settings-save")
    error = page.locator("#conversation-settings-error")
    await expect(error).to_have_text("The temperature must be between 0 and 2.")
    await expect(page.locator("#conversation-settings-saved")).to_have_text("")
    stored = await Conversation.objects.aget(id=conversation.id)
    assert (stored.system_prompt, stored.temperature) == ("Answer as a pirate.", 1.5)
    await page.click("#conversation-settings-close")
    await expect(panel).to_be_hidden()
