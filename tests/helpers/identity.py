"""A real OpenID Connect provider on loopback for the sign-in tests (tests/helpers/oidc_provider:
django-oauth-toolkit in a process of its own), the service configured to use it, and the browser's
part of a sign-in played with `requests`: the provider's login form, then back to the service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests

from tests.helpers.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "chat-service"
CLIENT_SECRET = "chat-service-secret-" + "s" * 24
# The tests' providers: "corp" speaks OpenID Connect and maps its groups to tiers; "gh" is the
# GitHub preset pointed at the same server (as at a GitHub Enterprise Server).
SLUGS = ("corp", "gh")
PROVIDER_PASSWORD = "provider-pass-1"


@dataclass
class TestProvider:
    url: str
    people_path: Path

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    def people(self, **people: dict) -> None:
        """Who can sign in at the provider, and what it says of them (tests/helpers/oidc_provider/people.py)."""
        for person in people.values():
            person.setdefault("password", PROVIDER_PASSWORD)
        self.people_path.write_text(json.dumps(people))


@pytest.fixture(scope="session")
def identity_provider_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("identity-provider")
    people = folder / "people.json"
    people.write_text("{}")
    port = free_port()
    redirects = [
        f"http://{host}/accounts/sso/{slug}/callback/" for host in ("testserver", "127.0.0.1") for slug in SLUGS
    ]
    env = os.environ | {"OIDC_TEST_DATABASE": str(folder / "provider.sqlite3"), "OIDC_TEST_PEOPLE": str(people)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.oidc_provider.serve", str(port), CLIENT_ID, CLIENT_SECRET, *redirects],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the server prints "ready" once it listens; an error ends it
        assert line.strip() == "ready", f"the identity provider did not start: {line!r}"
        yield TestProvider(url=f"http://127.0.0.1:{port}", people_path=people)
    finally:
        process.terminate()
        process.wait(timeout=10)


def provider_settings(provider: TestProvider, **overrides) -> list[dict]:
    corp = {
        "slug": "corp",
        "preset": "oidc",
        "label": "Corp ID",
        "issuer": provider.issuer,
        "tenant": "",
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "scopes": "",
        "tier_claim": "groups",
        "tier_map": [("chat-admins", "enterprise"), ("chat-pro", "pro")],
        "create_accounts": True,
    }
    gh = corp | {
        "slug": "gh",
        "preset": "github",
        "label": "",
        "issuer": provider.url,
        "tier_claim": "",
        "tier_map": [],
    }
    return [corp | overrides, gh]


@pytest.fixture
def identity_provider(identity_provider_server, settings):
    """The provider, with nobody at it yet, configured as the service's "corp" and "gh"."""
    identity_provider_server.people()
    settings.SSO_PROVIDERS = provider_settings(identity_provider_server)
    return identity_provider_server


def at_provider(authorize_url: str, username: str, password: str = PROVIDER_PASSWORD) -> str:
    """What a browser does at the provider: open the authorization URL, fill its login form, and
    follow it to the redirect back to the service. Returns that URL (the service's callback)."""
    browser = requests.Session()
    login_page = browser.get(authorize_url, timeout=10)
    assert urlsplit(login_page.url).path == "/login/", login_page.text[:500]
    form = {
        "username": username,
        "password": password,
        "csrfmiddlewaretoken": browser.cookies["idp_csrftoken"],
        "next": parse_qs(urlsplit(login_page.url).query)["next"][0],
    }
    response = browser.post(
        login_page.url, data=form, headers={"Referer": login_page.url}, allow_redirects=False, timeout=10
    )
    for _ in range(5):
        assert response.status_code == 302, response.text[:500]
        location = urljoin(response.url, response.headers["Location"])
        if not location.startswith(f"{urlsplit(authorize_url).scheme}://{urlsplit(authorize_url).netloc}/"):
            return location
        response = browser.get(location, allow_redirects=False, timeout=10)
    raise AssertionError("the provider did not send the browser back")


def sign_in_through(
    client, slug: str, username: str, *, password: str = PROVIDER_PASSWORD, next_url: str = "", tamper=None
):
    """A whole sign-in through provider `slug` with Django's test client as the browser: the
    button's POST, the provider's login form, and back. `tamper(callback_url) -> url` changes the way
    back. Returns the service's answer to it."""
    start = client.post(f"/accounts/sso/{slug}/start/", {"next": next_url})
    assert start.status_code == 302, start.content[:500]
    callback = at_provider(start["Location"], username, password)
    if tamper is not None:
        callback = tamper(callback)
    parts = urlsplit(callback)
    return client.get(f"{parts.path}?{parts.query}")
