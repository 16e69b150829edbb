"""What the browser tests share: Debian's headless Chromium, driven by Playwright, against the real
ASGI app (`chat_server`), and a user signed in on the chat page with its socket open: by the session
cookie (`sign_in`), or through the sign-up form in the tests about it (`sign_up`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.factories import PASSWORD

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
# The markdown an answer shows: rendered answers (static/chat/render.js) keep their source.
SOURCE = "el => ChatRender.source(el)"


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


@pytest.fixture(scope="session")
async def chromium():
    """One Chromium for the whole run (a launch costs seconds); each test gets a context of its own,
    which shares no cookies, storage or cache with another's."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


@pytest.fixture
async def page(chromium, chat_server):
    context = await chromium.new_context(base_url=chat_server)
    page = await context.new_page()
    page.set_default_timeout(90_000)
    page.base_url = chat_server  # for `sign_in`'s cookie
    yield page
    await context.close()


async def sign_in(page, username: str) -> None:
    """A new user, signed in by the session cookie a sign-in would have set, on the chat page with its
    socket open: as `sign_up` leaves them, without its form, for the tests that are not about it."""
    from channels.db import database_sync_to_async
    from django.conf import settings
    from django.test import Client

    from accounts.services import user_create

    def session_key() -> str:
        client = Client()
        client.force_login(user_create(username=username, password=PASSWORD, email=f"{username}@example.com"))
        return client.cookies[settings.SESSION_COOKIE_NAME].value

    cookie = {"name": settings.SESSION_COOKIE_NAME, "value": await database_sync_to_async(session_key)()}
    await page.context.add_cookies([{**cookie, "url": page.base_url}])
    await page.goto("/")
    await page.wait_for_selector("#composer")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")


async def sign_up(page, username: str) -> None:
    """A new user through the sign-up form, landing on the chat page with its socket open."""
    await page.goto("/accounts/signup/")
    await page.fill("input[name=username]", username)
    await page.fill("input[name=password1]", PASSWORD)
    await page.fill("input[name=password2]", PASSWORD)
    await page.click("button[type=submit]")
    await page.wait_for_selector("#composer")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")


BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
]
