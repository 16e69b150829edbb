"""The operations page in the admin: charts and the workers' table for staff, nothing for others."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from tests.browser.conftest import CHROMIUM
from tests.helpers.factories import PASSWORD

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
]


@pytest.fixture
async def chat_server(server_without_engine, monkeypatch):
    """No engine: the page shows the service's figures, whatever serves them."""
    from inference.execution.dispatch import local_backend

    async def not_started() -> None:
        return None

    monkeypatch.setattr(local_backend, "start", not_started)
    return server_without_engine


@pytest.fixture
def problems(page):
    """Script errors and CSP violations on the page: a test fails on any. (The admin's missing favicon
    is no script's.)"""
    found: list[str] = []
    page.on("pageerror", lambda error: found.append(str(error)))
    page.on(
        "console",
        lambda m: found.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text else None,
    )
    yield found
    assert found == []


async def admin_login(page, username: str) -> None:
    await page.goto("/admin/login/?next=/admin/operations/")  # the admin sends to the site's sign-in
    await page.fill("input[name=username]", username)
    await page.fill("input[name=password]", PASSWORD)
    await page.click("button[type=submit]")


async def test_staff_see_the_last_hours_charts_and_the_workers(page, problems, make_user):
    from observability import store

    staff = await database_sync_to_async(make_user)("olivia")
    staff.is_staff = True
    await staff.asave()
    now = time.time()
    for minutes_ago, ttft in ((3, 0.21), (2, 0.25), (1, 0.4)):
        store.sample_add(
            {"k": "g", "d": "smollm2-135m", "o": "complete", "ttft": ttft, "tok": 48}, at=now - 60 * minutes_ago
        )
    store.sample_add({"k": "r", "o": "rate_limited"}, at=now)
    store.sample_add({"k": "m", "s": "input", "a": "block"}, at=now)

    await admin_login(page, "olivia")
    await page.wait_for_selector("#operations[data-loaded=true]")
    assert await page.locator(".ops-chart .uplot canvas").count() == 5
    legend = await page.locator("[data-chart=ttft] .u-legend").inner_text()
    assert "smollm2-135m p50" in legend and "smollm2-135m p95" in legend
    assert "rate_limited" in await page.locator("[data-chart=outcomes] .u-legend").inner_text()
    assert "input:block" in await page.locator("[data-chart=moderation] .u-legend").inner_text()
    workers = page.locator("#ops-workers tr")
    assert await workers.count() >= 1
    assert "local:" in await workers.first.inner_text()


@pytest.mark.parametrize("who", ["alice", None])
async def test_others_are_sent_to_the_admin_login(page, problems, make_user, who, chat_server):
    import httpx

    if who:
        await database_sync_to_async(make_user)(who)
        await admin_login(page, who)
    for path in ("/admin/operations/", "/admin/operations/data/"):
        await page.goto(path)
        assert "/admin/login/" in page.url or "/accounts/login/" in page.url
        assert await page.locator("#operations").count() == 0
    async with httpx.AsyncClient(base_url=chat_server) as client:
        response = await client.get("/admin/operations/data/")
    assert response.status_code == 302 and "/admin/login/" in response.headers["location"]
