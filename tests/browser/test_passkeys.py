"""Passkeys as a person uses them, with Chromium's virtual authenticator (the DevTools protocol's
WebAuthn domain: a platform authenticator that keeps discoverable credentials and verifies its
user): added in the settings, then the second step after the password, then signing in with the
passkey alone, then removed."""

from __future__ import annotations

import pytest

from accounts.models import Passkey, User, UserSettings
from tests.browser.conftest import BROWSER_MARKS, sign_in
from tests.browser.test_branches import DESKTOP, PHONE
from tests.helpers.factories import PASSWORD

pytestmark = BROWSER_MARKS


@pytest.fixture
async def localhost_page(chromium, chat_server):
    """A page on http://localhost: WebAuthn takes a domain for the relying party, never an IP address."""
    url = chat_server.replace("127.0.0.1", "localhost")
    context = await chromium.new_context(base_url=url)
    page = await context.new_page()
    page.set_default_timeout(90_000)
    page.base_url = url
    yield page
    await context.close()


async def _virtual_authenticator(page) -> tuple[object, str]:
    cdp = await page.context.new_cdp_session(page)
    await cdp.send("WebAuthn.enable")
    added = await cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            }
        },
    )
    return cdp, added["authenticatorId"]


async def _sign_out(page, viewport) -> None:
    await page.goto("/")
    if viewport is PHONE:
        await page.click("#menu-button")
    await page.click("#log-out")
    await page.wait_for_url("**/accounts/login/**")


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_a_person_adds_a_passkey_and_signs_in_with_it(localhost_page, viewport, theme):
    page = localhost_page
    await page.set_viewport_size(viewport)
    await page.emulate_media(color_scheme=theme)
    await sign_in(page, "erin")
    erin = await User.objects.aget(username="erin")
    await UserSettings.objects.aupdate_or_create(user=erin, defaults={"theme": theme})
    cdp, authenticator = await _virtual_authenticator(page)

    await page.goto("/accounts/settings/")
    button = page.locator("#add-passkey")
    box = await button.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"]
    await page.fill("#passkey-add input[name=name]", "this laptop")
    await button.click()
    await page.wait_for_selector(".passkey-list .passkey-name:has-text('this laptop')")
    assert len((await cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator}))["credentials"]) == 1

    # The second step after the password.
    await _sign_out(page, viewport)
    await page.fill("input[name=username]", "erin")
    await page.fill("input[name=password]", PASSWORD)
    await page.click("form:not([data-passkey]) button[type=submit]")
    await page.wait_for_url("**/accounts/two-factor/")
    await page.click("#passkey-sign-in")
    await page.wait_for_selector("#composer")

    # The passkey alone, from the sign-in page.
    await _sign_out(page, viewport)
    await page.click("#passkey-sign-in")
    await page.wait_for_selector("#composer")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    passkey = await Passkey.objects.aget(user=erin)
    assert passkey.sign_count >= 2 or passkey.last_used_at is not None

    # Removed, after the password.
    await page.goto("/accounts/settings/")
    await page.click(".passkey-list a:has-text('Remove')")
    await page.fill("input[name=password]", PASSWORD)
    await page.click("#confirm-remove-passkey")
    await page.wait_for_url("**/accounts/settings/")
    assert await page.locator(".passkey-list").count() == 0
    assert not await Passkey.objects.filter(user=erin).aexists()


async def test_a_refused_passkey_says_why_and_keeps_nothing(localhost_page):
    page = localhost_page
    await sign_in(page, "fred")
    await _virtual_authenticator(page)
    await page.goto("/accounts/settings/")
    await page.fill("#passkey-add input[name=name]", "   ")  # no name, as the server sees it
    await page.click("#add-passkey")
    error = page.locator("#passkey-add [data-passkey-error]")
    await error.filter(has_text="Give the passkey a name").wait_for()
    assert not await Passkey.objects.aexists()
