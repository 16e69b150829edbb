from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from accounts.models import User
from accounts.services import LOGIN_FAILURES_PER_ACCOUNT, LOGIN_FAILURES_PER_ADDRESS, LOGIN_PERIOD_S
from tests.helpers.factories import PASSWORD


def test_signing_up_creates_a_user_and_logs_them_in(client, db):
    response = client.post(
        reverse("accounts:signup"),
        {"username": "carol", "email": "carol@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert response.status_code == 302
    assert response.url == reverse("conversations:chat")
    assert User.objects.get(username="carol").check_password(PASSWORD)
    assert client.get(reverse("conversations:chat")).status_code == 200


def _sign_up(username: str, address: str):
    data = {"username": username, "password1": PASSWORD, "password2": PASSWORD}
    return Client().post(reverse("accounts:signup"), data, REMOTE_ADDR=address)


def test_sign_ups_from_one_address_are_limited_and_a_refused_one_makes_no_account(db, buckets_stand_still, settings):
    for i in range(settings.SIGNUPS_PER_ADDRESS_PER_HOUR):
        assert _sign_up(f"bot{i}", "203.0.113.7").status_code == 302
    refused = _sign_up("one-too-many", "203.0.113.7")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 3600
    assert "Too many accounts have been created from your network address" in refused.content.decode()
    assert not User.objects.filter(username="one-too-many").exists()
    assert "_auth_user_id" not in refused.client.session
    # Someone on another network is not held back by it.
    assert _sign_up("carol", "198.51.100.1").status_code == 302


def test_sign_ups_from_one_network_are_limited_across_its_addresses(db, buckets_stand_still, settings):
    settings.SIGNUPS_PER_ADDRESS_PER_HOUR, settings.SIGNUPS_PER_NETWORK_PER_HOUR = 1, 3
    for i in range(3):
        assert _sign_up(f"bot{i}", f"2001:db8:1:2::{i + 1}").status_code == 302
    assert _sign_up("bot9", "2001:db8:1:2:ffff::9").status_code == 429  # the same /64
    assert _sign_up("carol", "2001:db8:1:3::1").status_code == 302  # the next one
    for i in range(3):
        assert _sign_up(f"v4bot{i}", f"192.0.2.{i + 1}").status_code == 302
    refused = _sign_up("v4bot9", "192.0.2.200")  # the same /24
    assert refused.status_code == 429 and "from your network lately" in refused.content.decode()
    assert not User.objects.filter(username__in=["bot9", "v4bot9"]).exists()


def test_a_sign_up_with_a_mistake_costs_nothing(db, buckets_stand_still, settings):
    settings.SIGNUPS_PER_ADDRESS_PER_HOUR = 1
    for _ in range(3):
        data = {"username": "dave", "password1": "123", "password2": "123"}
        assert Client().post(reverse("accounts:signup"), data, REMOTE_ADDR="203.0.113.7").status_code == 200
    assert _sign_up("dave", "203.0.113.7").status_code == 302


def test_a_weak_password_is_refused_with_a_message(client, db):
    response = client.post(reverse("accounts:signup"), {"username": "dave", "password1": "123", "password2": "123"})
    assert response.status_code == 200
    assert b"too short" in response.content
    assert not User.objects.filter(username="dave").exists()


def test_logging_in_and_out(client, alice):
    response = client.post(reverse("accounts:login"), {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(reverse("conversations:chat")).status_code == 200
    client.post(reverse("accounts:logout"))
    assert client.get(reverse("conversations:chat")).status_code == 302


def test_a_wrong_password_does_not_log_in(client, alice):
    response = client.post(reverse("accounts:login"), {"username": "alice", "password": "wrong"})
    assert response.status_code == 200
    assert "_auth_user_id" not in client.session


@pytest.fixture
def buckets_stand_still(monkeypatch):
    """The sign-in buckets' clock stopped: a slow machine's password hashing must not refill them
    between one attempt and the next (the embedded default's buckets read `time.time`)."""
    monkeypatch.setattr("accounts.ratelimit.time.time", lambda: 1_000_000.0)


def _log_in(client, username: str, password: str, address: str = "203.0.113.7"):
    return client.post(reverse("accounts:login"), {"username": username, "password": password}, REMOTE_ADDR=address)


def test_an_account_is_locked_after_repeated_failures_even_for_the_right_password(client, alice, buckets_stand_still):
    for _ in range(LOGIN_FAILURES_PER_ACCOUNT):
        assert _log_in(client, "alice", "guess").status_code == 200
    locked = _log_in(client, "alice", PASSWORD)
    assert locked.status_code == 429
    assert 1 <= int(locked["Retry-After"]) <= LOGIN_PERIOD_S
    assert "Too many failed sign-ins for this account" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    # Another address fares no better: the lock is the account's, and "Alice" is the same account.
    assert _log_in(client, "Alice", PASSWORD, address="198.51.100.1").status_code == 429


def test_the_admin_signs_in_through_the_sites_page_and_its_limits(client, alice):
    """The admin's own form would take a password alone: it sends to the site's sign-in, throttled
    and with the second factor; a POST to it signs nobody in."""
    alice.is_staff = True
    alice.save()
    response = client.get("/admin/login/?next=/admin/operations/")
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('accounts:login')}?next=/admin/operations/"
    client.post("/admin/login/", {"username": "alice", "password": PASSWORD})
    assert "_auth_user_id" not in client.session
    _log_in(client, "alice", PASSWORD)
    assert client.get("/admin/login/").status_code == 302 and client.get("/admin/").status_code == 200


def test_successful_sign_ins_do_not_count_towards_the_lock(client, alice):
    for _ in range(LOGIN_FAILURES_PER_ACCOUNT + 2):
        assert _log_in(client, "alice", PASSWORD).status_code == 302
        client.post(reverse("accounts:logout"))
    assert _log_in(client, "alice", "guess").status_code == 200


def test_an_address_is_locked_after_failures_across_accounts(client, alice, make_user, buckets_stand_still):
    names = [make_user(f"user{i}").username for i in range(LOGIN_FAILURES_PER_ADDRESS // LOGIN_FAILURES_PER_ACCOUNT)]
    for name in names:
        for _ in range(LOGIN_FAILURES_PER_ACCOUNT):
            assert _log_in(client, name, "guess").status_code == 200
    locked = _log_in(client, "alice", PASSWORD)
    assert locked.status_code == 429
    assert "Too many failed sign-ins for your network address" in locked.content.decode()
    # Alice herself, from her own address, is not locked out by it.
    assert _log_in(client, "alice", PASSWORD, address="198.51.100.1").status_code == 302


def test_an_admin_unlocks_a_locked_account(client, alice, make_user, buckets_stand_still):
    for _ in range(LOGIN_FAILURES_PER_ACCOUNT):
        _log_in(client, "alice", "guess")
    assert _log_in(client, "alice", PASSWORD).status_code == 429
    admin = make_user("root")
    User.objects.filter(id=admin.id).update(is_staff=True, is_superuser=True)
    staff = Client()
    staff.force_login(admin)
    response = staff.post(
        reverse("admin:accounts_user_changelist"),
        {"action": "unlock_sign_in", "_selected_action": [alice.id]},
        follow=True,
    )
    assert "Unlocked sign-in for 1 users." in response.content.decode()
    assert _log_in(client, "alice", PASSWORD).status_code == 302


def test_the_unlock_command_lifts_an_address_lock(client, alice, buckets_stand_still):
    for i in range(LOGIN_FAILURES_PER_ADDRESS):
        _log_in(client, f"nobody{i}", "guess")
    assert _log_in(client, "alice", PASSWORD).status_code == 429
    call_command("unlocklogin", "--address", "203.0.113.7", stderr=io.StringIO())
    assert _log_in(client, "alice", PASSWORD).status_code == 302
