"""The Content-Security-Policy in a real browser: every page works under it, and it refuses what it should.

Chromium reports each refusal on the console ("... violates the following Content Security Policy
directive ...") and as a `securitypolicyviolation` event; both are collected for the whole visit.
"""

from __future__ import annotations

import re

import pytest
from channels.db import database_sync_to_async

from accounts.models import User
from conversations.models import Conversation
from conversations.services import project_create
from tests.browser.conftest import BROWSER_MARKS, sign_up
from tests.helpers.factories import PASSWORD

pytestmark = BROWSER_MARKS

REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) =>
  console.error(`Content Security Policy violation: ${e.violatedDirective} ${e.blockedURI} at ${e.documentURI}`));
"""


@pytest.fixture
async def violations(page):
    """Every CSP refusal the browser reports while the test runs, on any page it visits."""
    seen: list[str] = []
    await page.add_init_script(REPORT_VIOLATIONS)
    page.on("console", lambda message: seen.append(message.text) if "Content Security Policy" in message.text else None)
    return seen


async def test_every_page_works_under_the_policy_without_a_violation(page, violations):  # noqa: F811
    # Sign-up, the chat page and its socket, one streamed answer.
    await sign_up(page, "olivia")
    await page.fill("#input", "Say hello.")
    await page.keyboard.press("Enter")
    await page.wait_for_selector("article.message.assistant.status-complete")
    assert "/c/" in page.url

    # Usage, and the keys page with its confirm before a key is revoked (a handler from a static file).
    await page.click(".account-links >> text=Usage")
    await page.wait_for_selector("#total-tokens")
    await page.goto("/accounts/keys/")
    await page.fill("input[name=name]", "laptop")
    await page.check("input[value=chat]")
    await page.click("button:text('Create key')")
    await page.wait_for_selector("#created-key")
    page.once("dialog", lambda dialog: dialog.dismiss())
    await page.click("text=Revoke")
    assert await page.locator("text=Revoke").count() == 1, "a dismissed confirm keeps the key"
    page.once("dialog", lambda dialog: dialog.accept())
    await page.click("text=Revoke")
    await page.wait_for_selector("td:text('revoked')")

    # Deleting a conversation asks first, too.
    conversation = await Conversation.objects.aget()
    await page.goto(f"/c/{conversation.id}/")
    page.once("dialog", lambda dialog: dialog.accept())
    await page.click("#delete-form button")
    await page.wait_for_selector("#empty")
    assert not await Conversation.objects.aexists()

    # Log out, and back in through the login page.
    await page.click("#log-out")
    # Where the sign-out lands, once its form is there (not the page's whole load: the chat page it
    # leaves may still be closing its socket).
    await page.wait_for_url(re.compile(r"/accounts/login/"), wait_until="commit")
    await page.wait_for_selector("input[name=username]")
    await page.fill("input[name=username]", "olivia")
    await page.fill("input[name=password]", PASSWORD)
    await page.click("button[type=submit]")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")

    # A project's page, its settings and the new-project dialog (projects.js builds them).
    olivia = await User.objects.aget(username="olivia")
    project = await database_sync_to_async(project_create)(owner=olivia, name="Plans", instructions="Be brief.")
    await page.goto(f"/p/{project.id}/")
    await page.click("#project-settings summary")
    await page.wait_for_selector("#project-instructions")
    await page.click("#new-project")
    await page.wait_for_selector("#project-new-dialog")
    await page.keyboard.press("Escape")

    # The admin: its index, every list and form it links to, and a change form with its widgets.
    await User.objects.filter(username="olivia").aupdate(is_staff=True, is_superuser=True)
    await page.goto("/admin/")
    links = await page.eval_on_selector_all("#content-main a[href^='/admin/']", "links => links.map(a => a.href)")
    assert len(links) >= 8
    for link in [
        *dict.fromkeys(links),
        f"/admin/accounts/user/{olivia.id}/change/",
        "/admin/billing/usagerecord/by-user/",
    ]:
        response = await page.goto(link)
        assert response.status == 200, link
        await page.wait_for_load_state("load")

    # Swagger UI: its start-up script is a file, and it renders the schema it fetches.
    await page.goto("/api/docs/")
    await page.wait_for_selector(".swagger-ui .opblock")
    await page.locator(".opblock-summary").first.click()
    await page.wait_for_selector(".opblock-body")

    assert violations == []


async def test_an_injected_inline_script_or_style_is_refused(page, violations):  # noqa: F811
    """What an attacker's markup would do, were it ever to reach a page: the real header refuses it."""
    injected = (
        '<script>window.injected = true</script><p id="styled" style="color: rgb(255, 0, 0)">styled</p>'
        '<img src=x onerror="window.injected = true">'
    )

    async def with_markup_injected(route):
        response = await route.fetch()
        html = (await response.text()).replace("</main>", injected + "</main>")
        await route.fulfill(response=response, body=html)

    await page.route(re.compile(r"/accounts/login/$"), with_markup_injected)
    response = await page.goto("/accounts/login/")
    policy = response.headers["content-security-policy"]
    assert "'unsafe-inline'" not in policy
    await page.wait_for_selector("#styled", state="attached")
    await page.wait_for_load_state("load")
    assert await page.evaluate("() => window.injected") is None
    assert await page.evaluate("() => getComputedStyle(document.getElementById('styled')).color") != "rgb(255, 0, 0)"
    assert any("script-src" in v for v in violations), violations
    assert any("style-src" in v for v in violations), violations
