"""What it costs, on the chat page: each answer's tokens and cost behind its info button (live and
after a reload), the conversation's total, and the sidebar's quota left, its warning near the end
and its message once run out, when a send is refused."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async

from accounts.models import Tier, User, UserSettings
from billing.models import TierModelPrice, UsageRecord
from billing.money import money_format
from tests.browser.conftest import BROWSER_MARKS, sign_in

pytestmark = [*BROWSER_MARKS, pytest.mark.usefixtures("short_answers")]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
LIGHT_PANEL = "rgb(246, 247, 249)"  # chat.css's light --panel


async def _ask(page, text: str) -> None:
    count = await page.locator("article.message.user").count() + 1
    await page.fill("#input", text)
    await page.keyboard.press("Enter")
    await page.wait_for_function(
        "(count) => { const a = document.querySelectorAll('article.message.assistant');"
        " return a.length === count && a[count - 1].dataset.status === 'complete'"
        " && document.getElementById('stop').hidden; }",
        arg=count,
    )


@database_sync_to_async
def _plan(**limits) -> None:
    """The free plan with a price per 1,000 tokens on the default model and the given quotas."""
    tier = Tier.objects.get(name="free")
    Tier.objects.filter(id=tier.id).update(**limits)
    TierModelPrice.objects.filter(tier=tier).update(
        prompt_price_per_1k=Decimal("0.5"), completion_price_per_1k=Decimal("1.5"), cached_prompt_price_per_1k=None
    )


@database_sync_to_async
def _records(username: str) -> list[UsageRecord]:
    return list(UsageRecord.objects.filter(user__username=username, kind="generation").order_by("created_at", "id"))


async def _panel(page, index: int) -> dict[str, str]:
    """Open the info panel of the `index`th answer and read it."""
    answer = page.locator("article.message.assistant").nth(index)
    button = answer.locator(".actions button.usage-info")
    await button.click()
    assert await button.get_attribute("aria-expanded") == "true"
    panel = answer.locator(".usage-panel")
    await panel.wait_for()
    return {
        name: await panel.locator(f"dd[data-usage={name}]").text_content()
        for name in ("prompt", "cached", "completion", "cost")
    }


def _expected(record: UsageRecord) -> dict[str, str]:
    return {
        "prompt": f"{record.prompt_tokens:,} tokens",
        "cached": f"{record.cached_tokens:,} tokens of the prompt, from the cache",
        "completion": f"{record.completion_tokens:,} tokens",
        "cost": money_format(record.cost),
    }


async def _sidebar_quota(page) -> tuple[str, str]:
    return await page.get_attribute("#quota", "data-state"), await page.text_content("#quota-words")


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_answers_show_what_they_cost_and_the_sidebar_what_is_left_until_a_send_is_refused(page, viewport, theme):
    await page.set_viewport_size(viewport)
    await _plan(tokens_per_day=100_000, tokens_per_month=None)
    await sign_in(page, "uma")
    await UserSettings.objects.aupdate_or_create(
        user=await User.objects.aget(username="uma"), defaults={"theme": theme}
    )
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    state, words = await _sidebar_quota(page)
    assert state == "ok"
    assert words.startswith("100,000 of 100,000 tokens left today · resets in ")
    assert await page.get_attribute("#quota-bar", "value") == "0"
    if viewport is PHONE:  # the quota is in the drawer the menu opens
        await page.click("#menu-button")
        box = await page.locator("#quota").bounding_box()
        assert box["width"] > 0 and box["x"] + box["width"] <= PHONE["width"]
        await page.keyboard.press("Escape")

    # Live: the answer's info button opens its tokens and cost, the total and the quota follow.
    await _ask(page, "Say hi.")
    [first] = await _records("uma")
    assert first.cost > 0
    assert await _panel(page, 0) == _expected(first)
    used = first.total_tokens
    await page.wait_for_function(
        "(text) => document.getElementById('conversation-usage').textContent === text",
        arg=f"{used:,} tokens · {money_format(first.cost)}",
    )
    assert (await _sidebar_quota(page))[1].startswith(f"{100_000 - used:,} of 100,000 tokens left today")
    assert await page.get_attribute("#quota-bar", "value") == str(used)

    panel = page.locator("article.message.assistant .usage-panel").first
    background = await panel.evaluate("p => getComputedStyle(p).backgroundColor")
    assert (background == LIGHT_PANEL) == (theme == "light"), "the panel takes the theme's colours"
    box = await panel.bounding_box()
    assert box["x"] + box["width"] <= viewport["width"], "the panel fits the screen"
    # The info button toggles: a second click closes the panel.
    await page.locator("article.message.assistant .actions button.usage-info").first.click()
    assert await page.locator("article.message.assistant .usage-panel").count() == 0

    # A second answer in the conversation: the total counts both.
    await _ask(page, "Say bye.")
    first, second = await _records("uma")
    used = first.total_tokens + second.total_tokens
    total = f"{used:,} tokens · {money_format(first.cost + second.cost)}"
    await page.wait_for_function(
        "(text) => document.getElementById('conversation-usage').textContent === text", arg=total
    )
    assert await _panel(page, 1) == _expected(second)

    # After a reload, from the page itself.
    await page.reload()
    await page.wait_for_selector("article.message.assistant .actions button.usage-info")
    assert await _panel(page, 0) == _expected(first)
    assert await _panel(page, 1) == _expected(second)
    assert await page.text_content("#conversation-usage") == total
    ok_background = await page.locator("#quota").evaluate("q => getComputedStyle(q).backgroundColor")

    # Near the quota (at least 80 % used): the sidebar warns, in words and in its look.
    await _plan(tokens_per_day=math.ceil(used / 0.9))
    await page.reload()
    state, words = await _sidebar_quota(page)
    assert state == "warning"
    assert words.startswith(f"{math.ceil(used / 0.9) - used:,} of {math.ceil(used / 0.9):,} tokens left today")
    assert await page.locator("#quota").evaluate("q => getComputedStyle(q).backgroundColor") != ok_background

    # Run out: it says so and what follows, and a send is refused with the reason.
    await _plan(tokens_per_day=used)
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    state, words = await _sidebar_quota(page)
    assert state == "exhausted"
    assert words.startswith(
        f"You have used all {used:,} of today's tokens. Messages are refused until the quota resets in "
    )
    await page.fill("#input", "One more?")
    await page.keyboard.press("Enter")
    await page.wait_for_selector("#request-error:not([hidden])")
    refusal = await page.text_content("#request-error")
    assert f"You have used today's {used:,} tokens on your plan" in refusal and "It resets at" in refusal
    assert await page.locator("article.message.assistant").count() == 2
    assert len(await _records("uma")) == 2
