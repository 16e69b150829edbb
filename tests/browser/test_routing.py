"""The chat page says which model wrote an answer when routing gave it to another deployment than the
one picked by name. Two deployments of the default model serve the public name `chat`; the canary,
which routing prefers, has a full queue, so the message falls back to the default deployment (the one
whose engine runs in this test session)."""

from __future__ import annotations

import pytest

from inference.models import ModelDeployment
from tests.browser.conftest import BROWSER_MARKS, sign_in
from tests.helpers.engines import SCRIPTED_DEFAULT
from tests.orchestration.test_routing import full_canary_before

pytestmark = BROWSER_MARKS


@pytest.fixture
def chat_name(default_deployment, bob, draws_the_heaviest) -> ModelDeployment:
    return full_canary_before(default_deployment, bob)


async def test_an_answer_that_fell_back_says_which_model_wrote_it_live_and_after_a_reload(page, chat_name):
    await sign_in(page, "frank")
    await page.select_option("#model", "chat")
    await page.fill("#input", "Say hello in five words.")
    await page.keyboard.press("Enter")

    answer = page.locator("article.message.assistant").last
    await page.wait_for_selector("article.message.assistant[data-status=complete]")
    assert await answer.locator(".answered-by").text_content() == f"Answered by {SCRIPTED_DEFAULT}"

    await page.reload()
    await page.wait_for_selector("article.message.assistant[data-status=complete]")
    answer = page.locator("article.message.assistant").last
    assert await answer.locator(".answered-by").text_content() == f"Answered by {SCRIPTED_DEFAULT}"
    assert await page.input_value("#model") == "chat"
