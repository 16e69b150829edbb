"""Verifying an account's email address: a signed link sent at sign-up, optional by default; where
the operator requires it, an account signs in only once its address is confirmed."""

from __future__ import annotations

import re

import pytest
from django.core import mail, signing
from django.test import Client
from django.urls import reverse

from accounts.models import User
from accounts.services import EMAIL_VERIFICATION_SALT
from tests.helpers.factories import PASSWORD


def _sign_up(client: Client, username: str = "nina", email: str = "nina@example.com", address: str = "203.0.113.20"):
    data = {"username": username, "email": email, "password1": PASSWORD, "password2": PASSWORD}
    return client.post(reverse("accounts:signup"), data, REMOTE_ADDR=address)


def _link(message) -> str:
    return re.search(r"https?://[^/\s]+(/\S+)", message.body).group(1)


def test_by_default_a_sign_up_sends_a_link_and_signs_in_without_waiting(db):
    client = Client()
    assert _sign_up(client).status_code == 302 and "_auth_user_id" in client.session
    (sent,) = mail.outbox
    assert sent.to == ["nina@example.com"]
    assert not User.objects.get(username="nina").email_verified
    page = Client().get(_link(sent))
    assert page.status_code == 200 and "confirmed" in page.content.decode()
    assert User.objects.get(username="nina").email_verified


def test_a_link_for_an_address_the_account_no_longer_has_or_tampered_or_expired_does_nothing(db, settings):
    _sign_up(Client())
    link = _link(mail.outbox[0])
    User.objects.filter(username="nina").update(email="other@example.com")
    assert Client().get(link).status_code == 400
    assert not User.objects.get(username="nina").email_verified
    nina = User.objects.get(username="nina")
    forged = signing.dumps({"user": nina.id, "email": nina.email}, salt="another purpose")
    assert Client().get(reverse("accounts:email_verify", args=[forged])).status_code == 400
    settings.EMAIL_VERIFICATION_MAX_AGE_S = -1  # every link is past its age
    fresh = signing.dumps({"user": nina.id, "email": nina.email}, salt=EMAIL_VERIFICATION_SALT)
    assert Client().get(reverse("accounts:email_verify", args=[fresh])).status_code == 400
    assert not User.objects.get(username="nina").email_verified


def test_where_required_an_account_signs_in_only_once_its_address_is_confirmed(db, settings):
    settings.EMAIL_VERIFICATION = "required"
    client = Client()
    no_address = _sign_up(client, username="noemail", email="")
    assert no_address.status_code == 200 and not User.objects.filter(username="noemail").exists()
    signed_up = _sign_up(client)
    assert signed_up.status_code == 200 and "_auth_user_id" not in client.session
    refused = client.post(reverse("accounts:login"), {"username": "nina", "password": PASSWORD})
    assert refused.status_code == 403 and "_auth_user_id" not in client.session
    # Sending the link again works from that page, for that account only, three times an hour with
    # the sign-up's own.
    statuses = [client.post(reverse("accounts:email_resend")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert {tuple(m.to) for m in mail.outbox} == {("nina@example.com",)} and len(mail.outbox) == 3
    assert Client().get(_link(mail.outbox[-1])).status_code == 200
    response = client.post(reverse("accounts:login"), {"username": "nina", "password": PASSWORD})
    assert response.status_code == 302 and "_auth_user_id" in client.session


def test_resending_without_a_sign_in_waiting_sends_nothing(db):
    response = Client().post(reverse("accounts:email_resend"))
    assert response.status_code == 302 and mail.outbox == []


@pytest.mark.parametrize("verified", [False, True])
def test_the_settings_page_says_whether_the_address_is_confirmed(alice, verified):
    if verified:
        User.objects.filter(id=alice.id).update(verified_email=alice.email)
    client = Client()
    client.force_login(alice)
    page = client.get(reverse("accounts:settings")).content.decode()
    assert ("(confirmed)" in page) == verified and ("Send a confirmation link" in page) == (not verified)
