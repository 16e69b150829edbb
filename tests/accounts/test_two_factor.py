"""Two-factor sign-in: an authenticator app's codes (TOTP) with recovery codes, set up from the
settings page, asked for after the password, required by the operator for staff or everyone, and
the admin's sign-in going through the same page."""

from __future__ import annotations

import re

import pyotp
import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from accounts.models import RecoveryCode, TotpDevice, User
from tests.helpers.factories import PASSWORD

SETUP_SECRET = "accounts.totp_setup_secret"


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _turn_on(client: Client, django_capture_on_commit_callbacks) -> tuple[str, list[str]]:
    page = client.get(reverse("accounts:two_factor_setup"))
    assert page.status_code == 200 and "<svg" in page.content.decode()
    secret = client.session[SETUP_SECRET]
    assert secret in page.content.decode()
    wrong = client.post(reverse("accounts:two_factor_setup"), {"code": "000000"})
    assert wrong.status_code == 400 and not TotpDevice.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        shown = client.post(reverse("accounts:two_factor_setup"), {"code": pyotp.TOTP(secret).now()})
    assert shown.status_code == 200
    codes = re.findall(r"<code>([0-9a-f]{6}-[0-9a-f]{6})</code>", shown.content.decode())
    assert len(codes) == 10
    return secret, codes


def _password_step(client: Client, username: str = "alice"):
    return client.post(
        reverse("accounts:login"), {"username": username, "password": PASSWORD}, REMOTE_ADDR="203.0.113.5"
    )


def test_with_it_on_a_sign_in_waits_for_a_code_that_works_once(alice, django_capture_on_commit_callbacks):
    secret, codes = _turn_on(_signed_in(alice), django_capture_on_commit_callbacks)
    assert mail.outbox[-1].subject == "Two-factor sign-in is on"
    assert not RecoveryCode.objects.filter(code_hash__in=codes).exists()  # kept as hashes only

    client = Client()
    response = _password_step(client)
    assert response.status_code == 302 and response["Location"] == reverse("accounts:two_factor")
    assert "_auth_user_id" not in client.session  # the password alone signs nobody in
    assert client.get(reverse("conversations:chat")).status_code == 302
    assert client.post(reverse("accounts:two_factor"), {"code": "123456"}).status_code == 400
    assert "_auth_user_id" not in client.session
    # A code from the step before is still taken once used (by another sign-in), never twice.
    device = TotpDevice.objects.get()
    code = pyotp.TOTP(secret).now()
    TotpDevice.objects.filter(id=device.id).update(last_step=0)
    assert client.post(reverse("accounts:two_factor"), {"code": code}).status_code == 302
    assert client.session["_auth_user_id"] == str(alice.id)

    replay = Client()
    _password_step(replay)
    assert replay.post(reverse("accounts:two_factor"), {"code": code}).status_code == 400


def test_a_recovery_code_signs_in_once(alice, django_capture_on_commit_callbacks):
    _, codes = _turn_on(_signed_in(alice), django_capture_on_commit_callbacks)
    first = Client()
    _password_step(first)
    assert first.post(reverse("accounts:two_factor"), {"code": codes[0].upper()}).status_code == 302
    again = Client()
    _password_step(again)
    assert again.post(reverse("accounts:two_factor"), {"code": codes[0]}).status_code == 400
    assert RecoveryCode.objects.filter(used_at__isnull=True).count() == 9


def test_guessing_codes_is_throttled_as_a_sign_in_is(alice, django_capture_on_commit_callbacks):
    _turn_on(_signed_in(alice), django_capture_on_commit_callbacks)
    client = Client()
    _password_step(client)
    statuses = [
        client.post(reverse("accounts:two_factor"), {"code": f"{i:06d}"}, REMOTE_ADDR="203.0.113.5").status_code
        for i in range(12)
    ]
    assert statuses[0] == 400 and statuses[-1] == 429


def test_the_second_step_needs_a_fresh_password_step(alice, django_capture_on_commit_callbacks):
    secret, _ = _turn_on(_signed_in(alice), django_capture_on_commit_callbacks)
    response = Client().post(reverse("accounts:two_factor"), {"code": pyotp.TOTP(secret).now()})
    assert response.status_code == 302 and response["Location"] == reverse("accounts:login")


def test_turning_it_off_asks_for_the_password(alice, django_capture_on_commit_callbacks):
    client = _signed_in(alice)
    _turn_on(client, django_capture_on_commit_callbacks)
    url = reverse("accounts:two_factor_disable")
    assert client.post(url, {"password": "nope"}).status_code == 400 and TotpDevice.objects.exists()
    assert client.post(url, {"password": PASSWORD}).status_code == 302
    assert not TotpDevice.objects.exists() and not RecoveryCode.objects.exists()


@pytest.mark.parametrize("required", ["staff", "everyone"])
def test_where_the_operator_requires_it_the_sign_in_sets_it_up_first(alice, settings, required):
    settings.TWO_FACTOR_REQUIRED = required
    User.objects.filter(id=alice.id).update(is_staff=True)
    client = Client()
    assert _password_step(client)["Location"] == reverse("accounts:two_factor")
    page = client.get(reverse("accounts:two_factor"))
    assert "Set up two-factor sign-in" in page.content.decode() and "_auth_user_id" not in client.session
    secret = client.session[SETUP_SECRET]
    done = client.post(reverse("accounts:two_factor"), {"code": pyotp.TOTP(secret).now()})
    assert done.status_code == 200 and "recovery-codes" in done.content.decode()
    assert client.session["_auth_user_id"] == str(alice.id)
    # It cannot be turned off while required.
    assert client.post(reverse("accounts:two_factor_disable"), {"password": PASSWORD}).status_code == 403
    assert TotpDevice.objects.filter(user=alice).exists()


def test_staff_only_leaves_everyone_else_with_the_password(alice, bob, settings):
    settings.TWO_FACTOR_REQUIRED = "staff"
    User.objects.filter(id=alice.id).update(is_staff=True)
    assert _password_step(Client(), "bob")["Location"] == reverse("conversations:chat")
    assert _password_step(Client(), "alice")["Location"] == reverse("accounts:two_factor")


def test_the_admin_cannot_be_entered_with_a_password_alone(alice, settings):
    settings.TWO_FACTOR_REQUIRED = "staff"
    User.objects.filter(id=alice.id).update(is_staff=True, is_superuser=True)
    client = Client()
    client.post("/admin/login/", {"username": "alice", "password": PASSWORD, "next": "/admin/"})
    assert "_auth_user_id" not in client.session
    assert client.get("/admin/").status_code == 302
