from __future__ import annotations

from django.urls import reverse

from accounts.models import User
from tests.conftest import PASSWORD


def test_signing_up_creates_a_user_and_logs_them_in(client, db):
    response = client.post(
        reverse("accounts:signup"),
        {"username": "carol", "email": "carol@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert response.status_code == 302
    assert response.url == reverse("conversations:chat")
    assert User.objects.get(username="carol").check_password(PASSWORD)
    assert client.get(reverse("conversations:chat")).status_code == 200


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
