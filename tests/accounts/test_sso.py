"""Signing in through an identity provider, against a real OpenID Connect provider on loopback
(django-oauth-toolkit in its own process: tests/helpers/identity.py)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.conf import settings as django_settings
from django.contrib.sessions.models import Session
from django.core import mail
from django.test import Client

from accounts.models import ExternalIdentity, SignedInSession, User
from accounts.services import LOGIN_FAILURES_PER_ADDRESS, login_attempt_admit, user_create
from tests.helpers.factories import PASSWORD
from tests.helpers.identity import at_provider, sign_in_through

pytestmark = pytest.mark.django_db


def _signed_in_as(client: Client) -> User | None:
    user_id = client.session.get("_auth_user_id")
    return User.objects.filter(id=user_id).first() if user_id else None


def _verified(user: User) -> User:
    User.objects.filter(id=user.id).update(verified_email=user.email)
    user.refresh_from_db()
    return user


@pytest.mark.topology
def test_a_new_person_gets_an_account_and_lands_in_the_chat(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
    client = Client()

    response = sign_in_through(client, "corp", "carol")

    assert response.status_code == 302 and response["Location"] == "/"
    carol = _signed_in_as(client)
    assert carol is not None and carol.username == "carol" and carol.email == "carol@corp.example"
    assert carol.email_verified and not carol.has_usable_password()
    assert ExternalIdentity.objects.get(user=carol).provider == "corp"
    # Listed among the places the account is signed in, like a password's sign-in.
    assert SignedInSession.objects.filter(user=carol, session_key=client.session.session_key).exists()
    assert client.get("/").status_code == 200


def test_the_same_person_signs_in_to_the_same_account_again(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
    first, second = Client(), Client()
    sign_in_through(first, "corp", "carol")
    sign_in_through(second, "corp", "carol")
    assert _signed_in_as(first) == _signed_in_as(second)
    assert User.objects.filter(email="carol@corp.example").count() == 1


def test_it_links_an_existing_account_by_its_confirmed_address_and_tells_its_owner(
    identity_provider, alice, django_capture_on_commit_callbacks
):
    _verified(alice)
    identity_provider.people(alice_at_corp={"email": "ALICE@example.com", "email_verified": True})
    client = Client()

    with django_capture_on_commit_callbacks(execute=True):
        sign_in_through(client, "corp", "alice_at_corp")

    assert _signed_in_as(client) == alice
    assert ExternalIdentity.objects.filter(user=alice, provider="corp").exists()
    assert alice.check_password(PASSWORD)  # the password stays
    assert any("linked" in message.subject for message in mail.outbox)


def test_an_unverified_address_takes_over_no_account_and_creates_none(identity_provider, alice):
    _verified(alice)
    identity_provider.people(mallory={"email": "alice@example.com", "email_verified": False})
    client = Client()

    response = sign_in_through(client, "corp", "mallory")

    assert response.status_code == 403
    assert b"has not verified your email address" in response.content
    assert _signed_in_as(client) is None
    assert not ExternalIdentity.objects.exists()
    assert User.objects.count() == 1


def test_an_account_whose_address_was_never_confirmed_is_not_linked(identity_provider):
    # Mallory signed up with Alice's address; Alice's provider must not hand her Mallory's account.
    squatted = user_create(username="squatter", password=PASSWORD, email="alice@corp.example")
    identity_provider.people(alice={"email": "alice@corp.example", "email_verified": True})
    client = Client()

    response = sign_in_through(client, "corp", "alice")

    assert response.status_code == 403 and b"has not confirmed it" in response.content
    assert _signed_in_as(client) is None
    assert not ExternalIdentity.objects.filter(user=squatted).exists()


def test_a_tampered_state_signs_nobody_in(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
    client = Client()

    def tamper(url: str) -> str:
        parts = urlsplit(url)
        query = {key: values[0] for key, values in parse_qs(parts.query).items()}
        query["state"] = query["state"][:-2] + "xx"
        return parts._replace(query=urlencode(query)).geturl()

    response = sign_in_through(client, "corp", "carol", tamper=tamper)

    assert response.status_code == 400
    assert _signed_in_as(client) is None and not User.objects.exists()


def test_a_callback_from_another_browser_signs_nobody_in(identity_provider):
    """Login CSRF: a way back that Mallory's browser started, opened in Alice's, has no state there."""
    identity_provider.people(mallory={"email": "mallory@corp.example", "email_verified": True})
    mallorys, alices = Client(), Client()
    start = mallorys.post("/accounts/sso/corp/start/")
    callback = urlsplit(at_provider(start["Location"], "mallory"))

    response = alices.get(f"{callback.path}?{callback.query}")

    assert response.status_code == 400 and _signed_in_as(alices) is None


def test_an_expired_id_token_is_refused(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True, "expired": True})
    client = Client()
    response = sign_in_through(client, "corp", "carol")
    assert response.status_code == 400 and _signed_in_as(client) is None
    assert not User.objects.exists()


def test_an_id_token_for_another_client_is_refused(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True, "aud": "another-client"})
    client = Client()
    response = sign_in_through(client, "corp", "carol")
    assert response.status_code == 400 and _signed_in_as(client) is None


def test_an_id_token_with_another_nonce_is_refused(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
    client = Client()
    start = client.post("/accounts/sso/corp/start/")
    callback = urlsplit(at_provider(start["Location"], "carol"))
    # The nonce this browser's flow expects is not the one the provider put in the token.
    session = client.session
    for key, value in session.items():
        if key.startswith("_state_sso-corp_"):
            value["data"]["nonce"] = "a-nonce-of-another-flow"
            session[key] = value
    session.save()

    response = client.get(f"{callback.path}?{callback.query}")

    assert response.status_code == 400 and _signed_in_as(client) is None


@pytest.mark.topology
def test_groups_map_to_a_tier_at_each_sign_in(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True, "groups": ["chat-pro"]})
    sign_in_through(Client(), "corp", "carol")
    carol = User.objects.get(username="carol")
    assert carol.tier.name == "pro"

    identity_provider.people(
        carol={"email": "carol@corp.example", "email_verified": True, "groups": ["staff", "chat-admins"]}
    )
    sign_in_through(Client(), "corp", "carol")
    carol.refresh_from_db()
    assert carol.tier.name == "enterprise"

    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True, "groups": []})
    sign_in_through(Client(), "corp", "carol")
    carol.refresh_from_db()
    assert carol.tier.is_default


def test_github_signs_in_with_its_primary_verified_address(identity_provider, alice):
    _verified(alice)
    identity_provider.people(alice_gh={"email": "alice@example.com", "email_verified": True})
    client = Client()
    response = sign_in_through(client, "gh", "alice_gh")
    assert response.status_code == 302 and _signed_in_as(client) == alice
    assert ExternalIdentity.objects.get(user=alice).provider == "gh"


def test_github_with_an_unverified_primary_address_is_refused(identity_provider, alice):
    _verified(alice)
    identity_provider.people(mallory={"email": "alice@example.com", "email_verified": False})
    client = Client()
    response = sign_in_through(client, "gh", "mallory")
    assert response.status_code == 403 and _signed_in_as(client) is None


def test_sign_out_ends_the_session(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
    client = Client()
    sign_in_through(client, "corp", "carol")
    session_key = client.session.session_key

    response = client.post("/accounts/logout/")

    assert response.status_code == 302
    assert not Session.objects.filter(session_key=session_key).exists()
    assert client.get("/")["Location"].startswith("/accounts/login/")


def test_a_second_factor_is_asked_after_the_provider(identity_provider, alice):
    from accounts.models import TotpDevice

    _verified(alice)
    TotpDevice.objects.create(user=alice, secret="JBSWY3DPEHPK3PXP")
    identity_provider.people(alice_at_corp={"email": "alice@example.com", "email_verified": True})
    client = Client()

    response = sign_in_through(client, "corp", "alice_at_corp")

    assert response["Location"] == "/accounts/two-factor/"
    assert _signed_in_as(client) is None


@pytest.mark.topology
def test_a_locked_account_stays_locked_through_a_provider(identity_provider, alice):
    _verified(alice)
    identity_provider.people(alice_at_corp={"email": "alice@example.com", "email_verified": True})
    ExternalIdentity.objects.create(user=alice, provider="corp", subject="x", email=alice.email)
    for _ in range(5):
        login_attempt_admit(username="alice", address="10.9.9.9")
    client = Client()
    sign_in_through(client, "corp", "alice_at_corp")  # links by address, then finds the account locked
    assert _signed_in_as(client) is None


@pytest.mark.topology
def test_callbacks_count_against_the_address_sign_in_limit(identity_provider):
    for _ in range(LOGIN_FAILURES_PER_ADDRESS):
        login_attempt_admit(username=None, address="127.0.0.1")
    client = Client()
    response = client.get("/accounts/sso/corp/callback/?code=x&state=y")
    assert response.status_code == 429 and response["Retry-After"]


class TestPasswordsOff:
    @pytest.fixture(autouse=True)
    def passwords_off(self, settings, identity_provider):
        settings.PASSWORD_SIGN_IN = "off"
        settings.PASSWORD_SIGN_IN_ALLOWED = ["superusers", "ops"]

    def test_a_password_no_longer_signs_in(self, alice):
        client = Client()
        response = client.post("/accounts/login/", {"username": "alice", "password": PASSWORD})
        assert response.status_code == 403 and _signed_in_as(client) is None
        assert b"Sign in with Corp ID" in response.content

    def test_a_superuser_still_signs_in_with_a_password(self):
        User.objects.create_superuser("root", "root@example.com", PASSWORD)
        client = Client()
        response = client.post("/accounts/login/", {"username": "root", "password": PASSWORD})
        assert response.status_code == 302 and _signed_in_as(client).username == "root"

    def test_a_named_account_still_signs_in_with_a_password(self):
        user_create(username="ops", password=PASSWORD)
        client = Client()
        assert client.post("/accounts/login/", {"username": "ops", "password": PASSWORD}).status_code == 302

    def test_sign_up_is_closed_and_the_provider_still_signs_in(self, identity_provider):
        assert Client().post("/accounts/signup/", {"username": "x"}).status_code == 403
        identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
        client = Client()
        sign_in_through(client, "corp", "carol")
        assert _signed_in_as(client).username == "carol"

    def test_no_reset_link_goes_to_an_account_that_may_not_use_a_password(self, alice, client):
        response = client.post("/accounts/password/reset/", {"email": alice.email})
        assert response.status_code == 302 and not mail.outbox

    def test_the_password_cannot_be_changed(self, alice, client):
        client.force_login(alice)
        assert client.get("/accounts/password/change/").status_code == 403


def test_an_account_without_a_password_is_deleted_after_signing_in_again(identity_provider):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
    client = Client()
    sign_in_through(client, "corp", "carol")
    session = client.session
    session["accounts.sso_reauthenticated_at"] = 0  # long ago
    session.save()

    refused = client.post("/accounts/delete/", {"understood": "on"})
    assert refused.status_code == 400 and b"Confirm with Corp ID" in refused.content

    start = client.post("/accounts/sso/corp/start/", {"reauthenticate": "1", "next": "/accounts/delete/"})
    assert parse_qs(urlsplit(start["Location"]).query)["prompt"] == ["login"]
    back = urlsplit(at_provider(start["Location"], "carol"))
    assert client.get(f"{back.path}?{back.query}")["Location"] == "/accounts/delete/"

    assert client.post("/accounts/delete/", {"understood": "on"}).status_code == 200
    assert not User.objects.filter(username="carol").exists()


def test_signing_in_again_as_someone_else_proves_nothing(identity_provider, alice):
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
    sign_in_through(Client(), "corp", "carol")
    _verified(alice)
    client = Client()
    client.force_login(alice)
    start = client.post("/accounts/sso/corp/start/", {"reauthenticate": "1"})
    back = urlsplit(at_provider(start["Location"], "carol"))
    assert client.get(f"{back.path}?{back.query}").status_code == 403
    assert "accounts.sso_reauthenticated_at" not in client.session


class TestEndpoints:
    def test_an_unknown_provider_is_a_404(self, identity_provider, client):
        assert client.post("/accounts/sso/nope/start/").status_code == 404
        assert client.get("/accounts/sso/nope/callback/").status_code == 404

    def test_start_takes_only_post_with_a_csrf_token(self, identity_provider):
        client = Client(enforce_csrf_checks=True)
        assert client.get("/accounts/sso/corp/start/").status_code == 405
        assert client.post("/accounts/sso/corp/start/").status_code == 403

    @pytest.mark.parametrize(
        "query",
        ["", "?code=x", "?state=y", "?code=x&state=y", "?error=access_denied&state=y", "?code=%00&state=%ff%fe"],
    )
    def test_a_bad_callback_is_a_4xx(self, identity_provider, client, query):
        response = client.get(f"/accounts/sso/corp/callback/{query}")
        assert 400 <= response.status_code < 500

    def test_next_never_leaves_the_site(self, identity_provider):
        identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
        client = Client()
        response = sign_in_through(client, "corp", "carol", next_url="https://evil.example/")
        assert response["Location"] == "/"

    def test_an_unreachable_provider_is_a_502(self, identity_provider, settings, client):
        from tests.helpers.identity import provider_settings
        from tests.helpers.servers import free_port

        settings.SSO_PROVIDERS = provider_settings(identity_provider, issuer=f"http://127.0.0.1:{free_port()}/o")
        assert client.post("/accounts/sso/corp/start/").status_code == 502

    def test_the_login_page_offers_each_provider(self, identity_provider, client):
        page = client.get("/accounts/login/").content.decode()
        assert "Sign in with Corp ID" in page and "Sign in with GitHub" in page


def test_an_admin_configured_provider_takes_its_secret_from_the_environment(identity_provider, settings, monkeypatch):
    from accounts.models import IdentityProvider
    from accounts.oidc import provider_get
    from tests.helpers.identity import CLIENT_ID, CLIENT_SECRET

    settings.SSO_PROVIDERS = []
    IdentityProvider.objects.create(
        slug="corp", label="Corp", issuer=identity_provider.issuer, client_id=CLIENT_ID, client_secret_env="CORP_SECRET"
    )
    assert provider_get(slug="corp") is None  # its secret is not set: not offered
    monkeypatch.setenv("CORP_SECRET", CLIENT_SECRET)
    identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
    client = Client()
    sign_in_through(client, "corp", "carol")
    assert _signed_in_as(client).username == "carol"


def test_settings_reject_a_provider_without_https(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from chatsite.env import sso_providers_from_env

    monkeypatch.setenv("SSO_PROVIDERS", "corp")
    monkeypatch.setenv("SSO_CORP_CLIENT_ID", "id")
    monkeypatch.setenv("SSO_CORP_CLIENT_SECRET", "secret")
    monkeypatch.setenv("SSO_CORP_ISSUER", "http://idp.example.com")
    with pytest.raises(ImproperlyConfigured):
        sso_providers_from_env("SSO_PROVIDERS")
    monkeypatch.setenv("SSO_CORP_ISSUER", "https://idp.example.com")
    monkeypatch.setenv("SSO_CORP_TIER_MAP", "admins=enterprise,staff")
    with pytest.raises(ImproperlyConfigured):
        sso_providers_from_env("SSO_PROVIDERS")
    monkeypatch.setenv("SSO_CORP_TIER_MAP", "admins=enterprise")
    assert sso_providers_from_env("SSO_PROVIDERS")[0]["tier_map"] == [("admins", "enterprise")]
    assert django_settings.PASSWORD_SIGN_IN in ("on", "off")


def test_the_admin_refuses_a_provider_it_could_not_use(admin_client):
    from accounts.models import IdentityProvider

    form = {
        "slug": "corp",
        "label": "Corp",
        "preset": "oidc",
        "issuer": "http://idp.example.com",
        "tenant": "",
        "client_id": "chat",
        "client_secret_env": "not a variable",
        "scopes": "",
        "tier_claim": "groups",
        "tier_map": '[["admins", "no-such-tier"]]',
        "create_accounts": "on",
        "enabled": "on",
    }
    response = admin_client.post("/admin/accounts/identityprovider/add/", form)
    assert response.status_code == 200 and not IdentityProvider.objects.exists()
    page = response.content.decode()
    assert "is not an https URL" in page and "environment variable" in page and "No such tier" in page

    form |= {
        "issuer": "https://idp.example.com",
        "client_secret_env": "SSO_CORP_SECRET",
        "tier_map": '[["admins", "pro"]]',
    }
    assert admin_client.post("/admin/accounts/identityprovider/add/", form).status_code == 302
    assert IdentityProvider.objects.get().tier_map == [["admins", "pro"]]


def test_the_admin_shows_a_users_linked_sign_ins_and_passkeys(admin_client, alice):
    ExternalIdentity.objects.create(user=alice, provider="corp", subject="s-1", email=alice.email)
    page = admin_client.get(f"/admin/accounts/user/{alice.id}/change/")
    assert page.status_code == 200 and b"s-1" in page.content


class TestUnlinking:
    def test_a_person_unlinks_a_provider_and_is_told(self, alice, client, django_capture_on_commit_callbacks):
        identity = ExternalIdentity.objects.create(user=alice, provider="corp", subject="s-1", email=alice.email)
        client.force_login(alice)
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(f"/accounts/sso/linked/{identity.id}/remove/")
        assert response["Location"] == "/accounts/settings/" and not ExternalIdentity.objects.exists()
        assert any("unlinked" in message.subject.lower() for message in mail.outbox)

    def test_another_persons_link_is_a_404(self, alice, bob, client):
        identity = ExternalIdentity.objects.create(user=alice, provider="corp", subject="s-1")
        client.force_login(bob)
        assert client.post(f"/accounts/sso/linked/{identity.id}/remove/").status_code == 404
        assert ExternalIdentity.objects.exists()

    def test_the_only_way_in_stays(self, identity_provider):
        identity_provider.people(carol={"email": "carol@corp.example", "email_verified": True})
        client = Client()
        sign_in_through(client, "corp", "carol")
        identity = ExternalIdentity.objects.get()
        assert client.post(f"/accounts/sso/linked/{identity.id}/remove/").status_code == 409
        assert ExternalIdentity.objects.exists()

    def test_it_needs_a_signed_in_person_a_post_and_a_csrf_token(self, alice):
        identity = ExternalIdentity.objects.create(user=alice, provider="corp", subject="s-1")
        url = f"/accounts/sso/linked/{identity.id}/remove/"
        assert Client().post(url)["Location"].startswith("/accounts/login/")
        client = Client(enforce_csrf_checks=True)
        client.force_login(alice)
        assert client.get(url).status_code == 405
        assert client.post(url).status_code == 403
        assert ExternalIdentity.objects.exists()
