"""A forgotten password: reset by email with a one-time, expiring link that tells nothing about which
addresses have accounts; a password changed from the settings page; and the notice of either."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.tokens import default_token_generator
from django.core import mail
from django.test import Client
from django.urls import reverse

from accounts.models import User
from tests.helpers.factories import PASSWORD

NEW_PASSWORD = "another long enough password 2"


def _ask_reset(client: Client, email: str, address: str = "203.0.113.9"):
    return client.post(reverse("accounts:password_reset"), {"email": email}, REMOTE_ADDR=address)


def _link(message) -> str:
    return re.search(r"https?://[^/\s]+(/\S+)", message.body).group(1)


def test_a_reset_link_sets_a_new_password_once_and_ends_the_old_sessions(alice, django_capture_on_commit_callbacks):
    signed_in = Client()
    signed_in.force_login(alice)
    response = _ask_reset(Client(), "ALICE@example.com")
    assert response.status_code == 302 and response["Location"] == reverse("accounts:password_reset_done")
    (sent,) = mail.outbox
    assert sent.to == ["alice@example.com"] and "works once" in sent.body
    link = _link(sent)

    browser = Client()
    form = browser.get(link, follow=True)
    assert form.status_code == 200 and "Choose a new password" in form.content.decode()
    set_url = form.redirect_chain[-1][0]
    with django_capture_on_commit_callbacks(execute=True):
        done = browser.post(set_url, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert done.status_code == 302 and done["Location"] == reverse("accounts:password_reset_complete")
    assert User.objects.get(id=alice.id).check_password(NEW_PASSWORD)
    # The old session is over, the notice went out, and the link is spent.
    assert signed_in.get(reverse("accounts:settings")).status_code == 302
    assert mail.outbox[-1].subject == "Your password was changed" and "reset link" in mail.outbox[-1].body
    again = Client().get(link, follow=True)
    assert "no longer works" in again.content.decode()
    assert Client().login(username="alice", password=NEW_PASSWORD)


def test_an_unknown_address_gets_the_same_answer_and_no_mail(alice):
    known = _ask_reset(Client(), "alice@example.com", address="203.0.113.1")
    unknown = _ask_reset(Client(), "nobody@example.com", address="203.0.113.2")
    assert (known.status_code, known["Location"]) == (unknown.status_code, unknown["Location"])
    assert [m.to for m in mail.outbox] == [["alice@example.com"]]


def test_an_expired_link_no_longer_works(alice, settings, monkeypatch):
    _ask_reset(Client(), "alice@example.com")
    link = _link(mail.outbox[0])
    # Past the link's life: the token generator's clock moved on by more than the timeout.
    later = default_token_generator._now() + dt.timedelta(seconds=settings.PASSWORD_RESET_TIMEOUT + 60)
    monkeypatch.setattr(default_token_generator, "_now", lambda: later)
    page = Client().get(link, follow=True)
    assert "no longer works" in page.content.decode()


def test_resets_are_throttled_per_address_and_per_email_whether_or_not_an_account_exists(alice, settings):
    client = Client()
    by_email = [_ask_reset(client, "nobody@example.com", address=f"198.51.100.{i}").status_code for i in range(4)]
    assert by_email == [302, 302, 302, 429]
    by_address = [_ask_reset(client, f"n{i}@example.com", address="192.0.2.7").status_code for i in range(6)]
    assert by_address == [302] * 5 + [429]
    refused = _ask_reset(client, "alice@example.com", address="192.0.2.7")
    assert refused.status_code == 429 and "Too many password resets" in refused.content.decode()
    assert refused["Retry-After"]
    assert mail.outbox == []


def test_a_password_changed_from_settings_keeps_this_session_ends_the_others_and_says_so(
    alice, django_capture_on_commit_callbacks
):
    here, there = Client(), Client()
    here.force_login(alice)
    there.force_login(alice)
    url = reverse("accounts:password_change")
    wrong = here.post(url, {"old_password": "nope", "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert wrong.status_code == 200 and User.objects.get(id=alice.id).check_password(PASSWORD)
    with django_capture_on_commit_callbacks(execute=True):
        response = here.post(
            url, {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}
        )
    assert response.status_code == 302
    assert here.get(reverse("accounts:settings")).status_code == 200
    assert there.get(reverse("accounts:settings")).status_code == 302
    (notice,) = mail.outbox
    assert notice.to == ["alice@example.com"] and "settings page" in notice.body


@pytest.mark.parametrize("name", ["password_reset", "password_change"])
def test_the_password_forms_refuse_a_post_without_the_csrf_token(alice, name):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(reverse(f"accounts:{name}"), {"email": "alice@example.com"}).status_code == 403
    assert mail.outbox == []
