"""Passkeys: registering one in the settings, and signing in with one (the second step, or alone),
with real signatures from a software authenticator (tests/helpers/authenticator.py) checked by
py_webauthn."""

from __future__ import annotations

import json

import pytest
from django.core import mail
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from accounts.models import Passkey, User
from accounts.passkeys import CHALLENGE_SESSION
from accounts.services import LOGIN_FAILURES_PER_ACCOUNT
from tests.helpers.authenticator import SoftAuthenticator, b64url
from tests.helpers.databases import rate_limits_clear
from tests.helpers.factories import PASSWORD

pytestmark = pytest.mark.django_db


def _post(client: Client, url: str, body: object = None, **extra):
    data = "{}" if body is None else (body if isinstance(body, str | bytes) else json.dumps(body))
    return client.post(url, data=data, content_type="application/json", **extra)


def _register(client: Client, authenticator: SoftAuthenticator, name: str = "laptop", **create):
    options = _post(client, "/accounts/passkeys/options/").json()
    return _post(client, "/accounts/passkeys/", {"name": name, "credential": authenticator.create(options, **create)})


@pytest.fixture
def alices_passkey(alice, django_capture_on_commit_callbacks):
    authenticator = SoftAuthenticator()
    client = Client()
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert _register(client, authenticator).status_code == 201
    return authenticator


def _signed_in_as(client: Client) -> User | None:
    user_id = client.session.get("_auth_user_id")
    return User.objects.filter(id=user_id).first() if user_id else None


def _second_step(client: Client, username: str = "alice") -> None:
    response = client.post("/accounts/login/", {"username": username, "password": PASSWORD})
    assert response["Location"] == "/accounts/two-factor/"


class TestRegistering:
    def test_a_person_registers_a_named_passkey_and_is_told(self, alice, alices_passkey):
        (passkey,) = Passkey.objects.filter(user=alice)
        assert passkey.name == "laptop" and passkey.transports == ["internal"]
        assert any("passkey" in message.subject.lower() for message in mail.outbox)

    def test_the_settings_page_lists_them(self, alice, alices_passkey, client):
        client.force_login(alice)
        page = client.get("/accounts/settings/").content.decode()
        assert "laptop" in page and 'data-passkey="register"' in page

    def test_a_challenge_works_once(self, alice):
        client, authenticator = Client(), SoftAuthenticator()
        client.force_login(alice)
        options = _post(client, "/accounts/passkeys/options/").json()
        credential = authenticator.create(options)
        assert _post(client, "/accounts/passkeys/", {"name": "a", "credential": credential}).status_code == 201
        again = _post(client, "/accounts/passkeys/", {"name": "b", "credential": credential})
        assert again.status_code == 400 and again.json()["error"]["code"] == "passkey_expired"

    def test_an_expired_challenge_is_refused(self, alice):
        client, authenticator = Client(), SoftAuthenticator()
        client.force_login(alice)
        options = _post(client, "/accounts/passkeys/options/").json()
        session = client.session
        session[CHALLENGE_SESSION] = session[CHALLENGE_SESSION] | {"at": 0}
        session.save()
        response = _post(client, "/accounts/passkeys/", {"name": "a", "credential": authenticator.create(options)})
        assert response.status_code == 400 and not Passkey.objects.exists()

    @pytest.mark.parametrize(
        "create",
        [{"origin": "https://evil.example"}, {"challenge": b64url(b"another challenge")}],
        ids=["origin", "challenge"],
    )
    def test_a_signature_for_another_origin_or_challenge_is_refused(self, alice, create):
        client = Client()
        client.force_login(alice)
        response = _register(client, SoftAuthenticator(), **create)
        assert response.status_code == 400 and not Passkey.objects.exists()

    def test_a_passkey_for_another_site_is_refused(self, alice):
        client = Client()
        client.force_login(alice)
        options = _post(client, "/accounts/passkeys/options/").json()
        options["rp"]["id"] = "evil.example"
        response = _post(
            client, "/accounts/passkeys/", {"name": "a", "credential": SoftAuthenticator().create(options)}
        )
        assert response.status_code == 400

    @pytest.mark.parametrize("name", ["", " ", "x" * 65, "a\x00b"])
    def test_a_bad_name_is_refused(self, alice, name):
        client = Client()
        client.force_login(alice)
        assert _register(client, SoftAuthenticator(), name=name).status_code == 400


class TestTheSecondStep:
    @pytest.mark.topology
    def test_a_passkey_is_the_second_factor(self, alice, alices_passkey):
        client = Client()
        _second_step(client)
        assert b"Use a passkey" in client.get("/accounts/two-factor/").content
        options = _post(client, "/accounts/two-factor/passkey/options/").json()
        assert [c["id"] for c in options["allowCredentials"]] == [Passkey.objects.get().credential_id]

        response = _post(client, "/accounts/two-factor/passkey/", {"credential": alices_passkey.get(options)})

        assert response.status_code == 200 and response.json()["redirect"] == "/"
        assert _signed_in_as(client) == alice
        assert Passkey.objects.get().sign_count == 1 and Passkey.objects.get().last_used_at is not None

    @pytest.mark.topology
    def test_the_same_answer_twice_signs_in_once(self, alice, alices_passkey):
        client = Client()
        _second_step(client)
        options = _post(client, "/accounts/two-factor/passkey/options/").json()
        answer = alices_passkey.get(options)
        replay = Client()
        _second_step(replay)
        assert _post(client, "/accounts/two-factor/passkey/", {"credential": answer}).status_code == 200
        assert _post(replay, "/accounts/two-factor/passkey/", {"credential": answer}).status_code == 400
        assert _signed_in_as(replay) is None

    def test_a_cloned_authenticator_is_refused(self, alice, alices_passkey):
        Passkey.objects.update(sign_count=50)  # the real one has signed more often than this copy
        client = Client()
        _second_step(client)
        options = _post(client, "/accounts/two-factor/passkey/options/").json()
        assert (
            _post(client, "/accounts/two-factor/passkey/", {"credential": alices_passkey.get(options)}).status_code
            == 400
        )

    def test_another_persons_passkey_is_not_bobs_second_factor(self, alice, alices_passkey, bob):
        bobs = SoftAuthenticator()
        bob_client = Client()
        bob_client.force_login(bob)
        assert _register(bob_client, bobs).status_code == 201
        client = Client()
        _second_step(client, "bob")
        options = _post(client, "/accounts/two-factor/passkey/options/").json()
        response = _post(client, "/accounts/two-factor/passkey/", {"credential": alices_passkey.get(options)})
        assert response.status_code == 400 and _signed_in_as(client) is None

    def test_without_a_pending_sign_in_it_is_a_401(self, client):
        assert _post(client, "/accounts/two-factor/passkey/options/").status_code == 401
        assert _post(client, "/accounts/two-factor/passkey/", {"credential": {}}).status_code == 401

    @pytest.mark.topology
    def test_failures_count_against_the_account(self, alice, alices_passkey):
        client = Client()
        _second_step(client)
        for _ in range(LOGIN_FAILURES_PER_ACCOUNT):
            _post(client, "/accounts/two-factor/passkey/options/")
            _post(client, "/accounts/two-factor/passkey/", {"credential": {"id": "nope"}})
        options = _post(client, "/accounts/two-factor/passkey/options/").json()
        response = _post(client, "/accounts/two-factor/passkey/", {"credential": alices_passkey.get(options)})
        assert response.status_code == 429 and response["Retry-After"]


class TestAlone:
    @pytest.mark.topology
    def test_a_passkey_signs_in_by_itself(self, alice, alices_passkey):
        client = Client()
        options = _post(client, "/accounts/login/passkey/options/").json()
        assert options["allowCredentials"] == [] and options["userVerification"] == "required"
        response = _post(client, "/accounts/login/passkey/", {"credential": alices_passkey.get(options)})
        assert response.status_code == 200 and _signed_in_as(client) == alice

    def test_a_user_handle_of_another_account_is_refused(self, alice, alices_passkey):
        client = Client()
        options = _post(client, "/accounts/login/passkey/options/").json()
        answer = alices_passkey.get(options)
        answer["response"]["userHandle"] = b64url(b"someone else")
        assert _post(client, "/accounts/login/passkey/", {"credential": answer}).status_code == 400
        assert _signed_in_as(client) is None

    def test_a_disabled_account_is_refused(self, alice, alices_passkey):
        User.objects.filter(id=alice.id).update(is_active=False)
        client = Client()
        options = _post(client, "/accounts/login/passkey/options/").json()
        assert _post(client, "/accounts/login/passkey/", {"credential": alices_passkey.get(options)}).status_code == 403


class TestRemoving:
    def test_removing_asks_for_the_password(self, alice, alices_passkey):
        client = Client()
        client.force_login(alice)
        passkey = Passkey.objects.get()
        url = f"/accounts/passkeys/{passkey.id}/remove/"
        assert client.post(url, {"password": "wrong"}).status_code == 400
        assert Passkey.objects.exists()
        assert client.post(url, {"password": PASSWORD})["Location"] == "/accounts/settings/"
        assert not Passkey.objects.exists()

    def test_another_persons_passkey_is_a_404(self, alices_passkey, bob):
        client = Client()
        client.force_login(bob)
        passkey = Passkey.objects.get()
        assert client.get(f"/accounts/passkeys/{passkey.id}/remove/").status_code == 404
        assert client.post(f"/accounts/passkeys/{passkey.id}/remove/", {"password": PASSWORD}).status_code == 404
        assert Passkey.objects.exists()


class TestEndpoints:
    SIGNED_IN = ["/accounts/passkeys/options/", "/accounts/passkeys/"]
    ANYONE = [
        "/accounts/two-factor/passkey/options/",
        "/accounts/two-factor/passkey/",
        "/accounts/login/passkey/options/",
        "/accounts/login/passkey/",
    ]

    @pytest.mark.parametrize("url", SIGNED_IN)
    def test_registering_needs_a_signed_in_person(self, url, client):
        assert _post(client, url)["Location"].startswith("/accounts/login/")

    @pytest.mark.parametrize("url", SIGNED_IN + ANYONE)
    def test_each_needs_a_csrf_token(self, alice, url):
        client = Client(enforce_csrf_checks=True)
        client.force_login(alice)
        assert _post(client, url).status_code == 403

    @pytest.mark.parametrize("url", SIGNED_IN + ANYONE)
    def test_each_takes_only_post(self, alice, client, url):
        client.force_login(alice)
        assert client.get(url).status_code == 405

    @pytest.mark.parametrize(
        "body",
        [
            "not json",
            "[]",
            '{"credential": 1}',
            '{"credential": {}, "name": 5}',
            '{"credential": {"id": "x", "response": 1}}',
        ],
    )
    @pytest.mark.parametrize("url", ["/accounts/passkeys/", "/accounts/login/passkey/"])
    def test_bad_input_is_a_400(self, alice, client, url, body):
        client.force_login(alice)
        _post(client, url.replace("passkey/", "passkey/options/") if "login" in url else "/accounts/passkeys/options/")
        response = _post(client, url, body)
        assert response.status_code == 400 and "error" in response.json()

    def test_a_huge_body_is_a_413(self, alice, client):
        client.force_login(alice)
        response = _post(client, "/accounts/passkeys/", {"name": "a", "credential": {"id": "x" * 100_000}})
        assert response.status_code == 413


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
CREDENTIAL_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "id": JSON | st.text(max_size=60),
        "rawId": JSON,
        "type": JSON,
        "response": st.dictionaries(
            st.sampled_from(["clientDataJSON", "attestationObject", "authenticatorData", "signature", "userHandle"]),
            JSON | st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_0123456789", max_size=80),
        )
        | JSON,
    },
)


@given(body=JSON | st.fixed_dictionaries({"credential": CREDENTIAL_FIELDS}, optional={"name": JSON}))
# 30 bodies, each sent to all three endpoints after their options: the shapes the parser tells apart
# (not an object, a credential missing or of the wrong type, each field of it wrong) are few, and the
# named bad bodies of `test_bad_input_is_a_400` reach each of them besides.
@hypothesis_settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_body_is_a_server_error_or_signs_in(alice, alices_passkey, body):
    rate_limits_clear()
    for options, url in [
        ("/accounts/passkeys/options/", "/accounts/passkeys/"),
        ("/accounts/login/passkey/options/", "/accounts/login/passkey/"),
        ("/accounts/two-factor/passkey/options/", "/accounts/two-factor/passkey/"),
    ]:
        client = Client()
        if "/accounts/passkeys/" in url:
            client.force_login(alice)
        else:
            _second_step(client)
        _post(client, options)
        response = _post(client, url, body)
        assert 400 <= response.status_code < 500, (url, body, response.content[:300])
    assert Passkey.objects.count() == 1
