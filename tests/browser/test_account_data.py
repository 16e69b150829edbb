"""Leaving with your data, as a person does it: the archive from the settings page, and deleting the
account after its password, landing signed out."""

from __future__ import annotations

import json
import re
import time
import zipfile

import pyotp
import pytest
from channels.db import database_sync_to_async
from django.core import mail

from accounts.models import User, UserSettings
from accounts.services import user_create
from conversations.models import Conversation
from tests.browser.conftest import BROWSER_MARKS, sign_up
from tests.browser.test_branches import DESKTOP, PHONE
from tests.helpers.factories import PASSWORD

pytestmark = BROWSER_MARKS

DANGER = {"light": "rgb(180, 35, 24)", "dark": "rgb(255, 138, 122)"}
BACKGROUND = {"light": "rgb(246, 247, 249)", "dark": "rgb(30, 33, 39)"}  # the sign-in pages: --panel
NEW_PASSWORD = "another long enough password 2"


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_a_person_downloads_their_data_and_deletes_their_account(page, viewport, theme):
    await page.set_viewport_size(viewport)
    await sign_up(page, "nora")
    nora = await User.objects.aget(username="nora")
    await UserSettings.objects.aupdate_or_create(user=nora, defaults={"theme": theme})
    await page.fill("#input", "Say hello.")
    await page.keyboard.press("Enter")
    await page.wait_for_selector("article.message.assistant.status-complete")

    await page.goto("/accounts/settings/")
    assert await page.locator("#sessions tbody tr").count() == 1
    async with page.expect_download() as download_info:
        await page.click("#download-data")
    download = await download_info.value
    archive = zipfile.ZipFile(await download.path())
    assert json.loads(archive.read("account.json"))["username"] == "nora"
    (conversation,) = [name for name in archive.namelist() if name.startswith("conversations/")]
    assert json.loads(archive.read(conversation))["messages"][0]["content"] == "Say hello."

    await page.click("#delete-account")
    button = page.locator("#confirm-delete")
    assert await button.evaluate("b => getComputedStyle(b).backgroundColor") == DANGER[theme]
    box = await button.bounding_box()
    assert box["x"] + box["width"] <= viewport["width"]
    await page.fill("input[name=password]", "not my password")
    await page.check("input[name=understood]")
    await button.click()
    await page.wait_for_selector("text=That is not your password.")
    assert await User.objects.filter(username="nora").aexists()

    await page.fill("input[name=password]", PASSWORD)
    await page.check("input[name=understood]")
    await page.click("#confirm-delete")
    await page.wait_for_selector("text=Your account is deleted")
    assert not await User.objects.filter(username="nora").aexists()
    assert not await Conversation.objects.aexists()
    await page.goto("/")
    assert "/accounts/login/" in page.url


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_a_forgotten_password_is_reset_through_the_emailed_link(page, viewport, theme):
    await page.set_viewport_size(viewport)
    await page.emulate_media(color_scheme=theme)
    await database_sync_to_async(user_create)(username="omar", password=PASSWORD, email="omar@example.com")
    await page.goto("/accounts/login/")
    await page.click("#forgot-password")
    await page.fill("input[name=email]", "omar@example.com")
    await page.click("button[type=submit]")
    await page.wait_for_selector("text=Check your email")
    background = await page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert background == BACKGROUND[theme]

    (sent,) = mail.outbox
    link = re.search(r"https?://\S+", sent.body).group(0)
    await page.goto(link)
    await page.fill("input[name=new_password1]", NEW_PASSWORD)
    await page.fill("input[name=new_password2]", NEW_PASSWORD)
    await page.click("button[type=submit]")
    await page.wait_for_selector("text=Your password is set")
    await page.click("text=Log in")
    await page.fill("input[name=username]", "omar")
    await page.fill("input[name=password]", NEW_PASSWORD)
    await page.click("button[type=submit]")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    await page.goto(link)
    await page.wait_for_selector("text=This link no longer works")


@pytest.mark.parametrize(
    ("viewport", "theme"), [(DESKTOP, "light"), (PHONE, "dark")], ids=["desktop-light", "phone-dark"]
)
async def test_two_factor_sign_in_is_turned_on_and_then_asked_for(page, viewport, theme):
    await page.set_viewport_size(viewport)
    await page.emulate_media(color_scheme=theme)
    await sign_up(page, "tess")
    await page.goto("/accounts/settings/")
    await page.click("#two-factor-setup")
    qr = page.locator("#totp-qr svg")
    box = await qr.bounding_box()
    assert box["width"] >= 120 and box["x"] + box["width"] <= viewport["width"]
    assert await qr.evaluate("q => getComputedStyle(q).backgroundColor") == "rgb(255, 255, 255)"
    secret = (await page.inner_text("#totp-secret")).strip()
    await page.fill("input[name=code]", pyotp.TOTP(secret).now())
    await page.click("button[type=submit]")
    await page.wait_for_selector("#recovery-codes li")  # the form's answer is a new page
    assert await page.locator("#recovery-codes li").count() == 10
    await page.click("#continue")
    await page.wait_for_selector("#two-factor-state >> text=is on")

    await page.context.clear_cookies()  # signed out
    await page.goto("/accounts/login/")
    await page.fill("input[name=username]", "tess")
    await page.fill("input[name=password]", PASSWORD)
    await page.click("button[type=submit]")
    await page.wait_for_selector("text=Type the code your authenticator app shows")
    await page.fill("input[name=code]", "000000")
    await page.click("button[type=submit]")
    await page.wait_for_selector("text=That code does not work")
    # The next step's code: the one just used to turn it on is spent.
    await page.fill("input[name=code]", pyotp.TOTP(secret).at(time.time() + 30))
    await page.click("button[type=submit]")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
