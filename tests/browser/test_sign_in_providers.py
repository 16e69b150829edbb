"""Signing in through an identity provider as a person does it: the sign-in page's button, the
provider's own login page (a real OpenID Connect provider on loopback: tests/helpers/identity.py),
and back into the chat; then signing out."""

from __future__ import annotations

import pytest

from accounts.models import ExternalIdentity, User, UserSettings
from tests.browser.conftest import BROWSER_MARKS
from tests.browser.test_branches import DESKTOP, PHONE
from tests.helpers.identity import PROVIDER_PASSWORD

pytestmark = BROWSER_MARKS


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_a_person_signs_in_with_their_organisation_and_lands_in_the_chat(
    page, identity_provider, viewport, theme
):
    await page.set_viewport_size(viewport)
    await page.emulate_media(color_scheme=theme)
    identity_provider.people(dana={"email": "dana@corp.example", "email_verified": True, "groups": ["chat-pro"]})

    await page.goto("/accounts/login/")
    button = page.get_by_role("button", name="Sign in with Corp ID")
    box = await button.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"]
    await button.click()

    await page.wait_for_selector("#idp-username")  # the provider's own page
    assert page.url.startswith(identity_provider.url)
    await page.fill("#idp-username", "dana")
    await page.fill("#idp-password", PROVIDER_PASSWORD)
    await page.click("#idp-submit")

    await page.wait_for_selector("#composer")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    dana = await User.objects.select_related("tier").aget(username="dana")
    assert dana.tier.name == "pro"
    assert await ExternalIdentity.objects.filter(user=dana, provider="corp").aexists()

    await UserSettings.objects.aupdate_or_create(user=dana, defaults={"theme": theme})
    await page.goto("/accounts/settings/")
    linked = await page.inner_text("#linked-sign-ins")
    assert "corp" in linked and "dana@corp.example" in linked
    assert await page.locator("#change-password").count() == 0  # no password to change

    await page.goto("/")
    if viewport is PHONE:
        await page.click("#menu-button")
    await page.click("#log-out")
    await page.wait_for_url("**/accounts/login/**")
    await page.goto("/")
    await page.wait_for_url("**/accounts/login/**")
