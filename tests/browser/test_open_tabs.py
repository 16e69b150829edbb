"""A tab past the user's cap of open chat sockets (CHAT_SOCKETS_PER_USER) says why it cannot
connect, and connects once another tab has closed. No engine: nothing here is answered."""

from __future__ import annotations

import pytest

from tests.browser.conftest import BROWSER_MARKS, sign_in

pytestmark = [mark for mark in BROWSER_MARKS if mark.name != "engine"]


@pytest.fixture
async def chat_server(server_without_engine, monkeypatch):
    from inference.execution.dispatch import local_backend

    async def not_started() -> None:
        return None

    monkeypatch.setattr(local_backend, "start", not_started)
    return server_without_engine


async def test_a_tab_past_the_cap_says_so_and_connects_once_another_closes(page, settings):
    settings.CHAT_SOCKETS_PER_USER = 1
    await sign_in(page, "tess")  # her first tab, its socket open
    second = await page.context.new_page()
    await second.goto("/")
    banner = second.locator("#connection-status")
    await banner.wait_for(state="visible", timeout=20_000)
    assert "Too many open chat tabs (at most 1)." in await banner.text_content()
    assert await second.locator("#chat").get_attribute("data-socket") == "closed"

    await page.close()
    await second.wait_for_selector("#chat[data-socket=open]", state="attached", timeout=40_000)
    assert await banner.is_hidden()
