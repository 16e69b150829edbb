from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from accounts.authentication import ApiKeyAuthentication, HasScope
from accounts.models import ApiKey, Tier
from accounts.services import api_key_authenticate, api_key_create, api_key_revoke
from chatsite.errors import ClientError
from conversations.models import Message
from conversations.requests import SendRequest
from conversations.services import message_send


class ModelsView(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "models:read"

    def get(self, request):
        return Response({"user": request.user.username, "key": request.auth.prefix})


def call_models(key: str | None):
    factory = APIRequestFactory()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    return ModelsView.as_view()(factory.get("/v1/models", **headers))


def test_a_new_key_is_shown_once_and_only_its_hash_is_stored(alice):
    created = api_key_create(user=alice, name="laptop", scopes=["chat", "models:read"])
    prefix, secret = created.key.removeprefix("cs_").split("_", 1)
    stored = ApiKey.objects.get()
    assert stored.prefix == prefix
    assert stored.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(ApiKey.objects.values().get())
    assert stored.display_key == f"cs_{prefix}_…"
    assert stored.scopes == ["chat", "models:read"]


def test_a_key_authenticates_its_owner_and_records_its_last_use_at_most_once_a_minute(alice):
    created = api_key_create(user=alice, name="script", scopes=["chat"])
    key = api_key_authenticate(key=created.key)
    assert key is not None and key.user == alice
    first_use = ApiKey.objects.get().last_used_at
    assert first_use is not None
    api_key_authenticate(key=created.key)
    assert ApiKey.objects.get().last_used_at == first_use
    ApiKey.objects.update(last_used_at=timezone.now() - dt.timedelta(minutes=2))
    api_key_authenticate(key=created.key)
    assert ApiKey.objects.get().last_used_at > first_use - dt.timedelta(seconds=1)


def test_a_revoked_key_stops_working_at_once(alice):
    created = api_key_create(user=alice, name="script", scopes=["models:read"])
    assert call_models(created.key).status_code == 200
    api_key_revoke(user=alice, api_key_id=created.api_key.id)
    assert api_key_authenticate(key=created.key) is None
    assert call_models(created.key).status_code == 401


def test_an_expired_key_stops_working(alice):
    created = api_key_create(
        user=alice, name="temporary", scopes=["models:read"], expires_at=timezone.now() + dt.timedelta(hours=1)
    )
    assert call_models(created.key).status_code == 200
    ApiKey.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert call_models(created.key).status_code == 401


@pytest.mark.parametrize(
    "key",
    ["cs_", "cs_abc", "cs_deadbeef_wrong", "sk-something", "cs_deadbeef_", "cs__x", "cs_%00_x", "x" * 500],
)
def test_unknown_or_tampered_keys_are_refused(alice, key):
    real = api_key_create(user=alice, name="real", scopes=["chat"])
    assert api_key_authenticate(key=key) is None
    assert api_key_authenticate(key=real.key[:-1] + ("A" if real.key[-1] != "A" else "B")) is None


def test_the_api_sets_the_user_and_the_key_and_refuses_a_missing_scope(alice):
    reader = api_key_create(user=alice, name="reader", scopes=["models:read"])
    response = call_models(reader.key)
    assert response.status_code == 200
    assert response.data == {"user": "alice", "key": reader.api_key.prefix}
    chatter = api_key_create(user=alice, name="chatter", scopes=["chat"])
    assert call_models(chatter.key).status_code == 403
    assert call_models(None).status_code == 401
    assert call_models("cs_nope_nope").status_code == 401


def test_a_key_without_the_chat_scope_cannot_send_a_message(alice):
    reader = api_key_create(user=alice, name="reader", scopes=["models:read"])
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="hi"), api_key=reader.api_key)
    assert refused.value.code == "insufficient_scope"
    assert refused.value.status == 403
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "", "scopes": ["chat"]},
        {"name": "x" * 101, "scopes": ["chat"]},
        {"name": "ok", "scopes": []},
        {"name": "ok", "scopes": ["admin"]},
        {"name": "ok", "scopes": "chat"},
        {"name": "ok", "scopes": ["chat"], "expires_at": dt.datetime(2000, 1, 1, tzinfo=dt.UTC)},
    ],
)
def test_bad_key_requests_are_refused_and_create_nothing(alice, fields):
    with pytest.raises(ClientError):
        api_key_create(user=alice, **fields)
    assert not ApiKey.objects.exists()


def test_nobody_can_revoke_another_users_key(alice, mallory):
    created = api_key_create(user=alice, name="alice's", scopes=["chat"])
    with pytest.raises(ClientError) as refused:
        api_key_revoke(user=mallory, api_key_id=created.api_key.id)
    assert refused.value.code == "not_found"
    assert api_key_authenticate(key=created.key) is not None


def test_the_settings_page_creates_a_key_shows_it_once_and_revokes_it(client, alice):
    client.force_login(alice)
    response = client.post(
        reverse("accounts:api_keys"), {"name": "laptop", "scopes": ["chat", "conversations:read"], "expires_on": ""}
    )
    # POST/redirect/GET: a reload of the page that shows the key does not post the form again.
    assert response.status_code == 302 and response["Location"] == reverse("accounts:api_keys")
    response = client.get(response["Location"])
    key = response.context["created"]["key"]
    assert key.encode() in response.content
    assert response["Cache-Control"].startswith("max-age=0")
    assert api_key_authenticate(key=key).name == "laptop"
    page = client.get(reverse("accounts:api_keys"))
    assert key.encode() not in page.content
    assert b"laptop" in page.content
    api_key = ApiKey.objects.get()
    response = client.post(reverse("accounts:api_key_revoke", args=[api_key.id]))
    assert response.status_code == 302
    assert api_key_authenticate(key=key) is None


def test_the_settings_page_refuses_bad_input_without_a_500(client, alice):
    client.force_login(alice)
    for data in (
        {"name": "", "scopes": ["chat"]},
        {"name": "x", "scopes": ["root"]},
        {"name": "x", "scopes": ["chat"], "expires_on": "2001-01-01"},
        {"name": "x", "scopes": ["chat"], "expires_on": "soon"},
    ):
        assert client.post(reverse("accounts:api_keys"), data).status_code == 400
    assert not ApiKey.objects.exists()


def test_the_settings_page_will_not_revoke_another_users_key(client, alice, mallory):
    created = api_key_create(user=alice, name="alice's", scopes=["chat"])
    client.force_login(mallory)
    assert client.post(reverse("accounts:api_key_revoke", args=[created.api_key.id])).status_code == 404
    assert api_key_authenticate(key=created.key) is not None


def test_the_key_pages_need_a_login(client, db):
    assert client.get(reverse("accounts:api_keys")).status_code == 302


def test_creating_keys_is_limited_per_user_by_the_plan(client, alice, bob):
    Tier.objects.filter(name="free").update(api_keys_per_day=3)
    client.force_login(alice)
    for i in range(3):
        assert client.post(reverse("accounts:api_keys"), {"name": f"k{i}", "scopes": ["chat"]}).status_code == 302
    refused = client.post(reverse("accounts:api_keys"), {"name": "one too many", "scopes": ["chat"]})
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 24 * 3600 // 3
    assert "limit of 3 new API keys a day" in refused.content.decode()
    assert ApiKey.objects.filter(user=alice).count() == 3
    client.force_login(bob)
    assert client.post(reverse("accounts:api_keys"), {"name": "bob's", "scopes": ["chat"]}).status_code == 302


def test_a_key_made_on_the_page_can_carry_its_own_caps(client, alice):
    client.force_login(alice)
    response = client.post(
        reverse("accounts:api_keys"),
        {"name": "capped", "scopes": ["chat"], "requests_per_minute": "5", "tokens_per_minute": "1000"},
    )
    assert response.status_code == 302
    key = ApiKey.objects.get(user=alice)
    assert (key.requests_per_minute, key.tokens_per_minute) == (5, 1000)
    bad = client.post(reverse("accounts:api_keys"), {"name": "bad", "scopes": ["chat"], "requests_per_minute": "0"})
    assert bad.status_code == 400 and ApiKey.objects.count() == 1


def test_a_new_keys_default_scopes_let_it_list_models_chat_and_embed(client, alice):
    client.force_login(alice)
    page = client.get(reverse("accounts:api_keys"))
    assert set(page.context["form"]["scopes"].initial) == {"chat", "models:read", "embeddings"}
    # The form as the page ticks it by default: the key it makes lists models and may chat.
    client.post(reverse("accounts:api_keys"), {"name": "client", "scopes": page.context["form"]["scopes"].initial})
    key = client.get(reverse("accounts:api_keys")).context["created"]["key"]
    assert call_models(key).status_code == 200
    assert api_key_authenticate(key=key).has_scope("chat")
    assert api_key_authenticate(key=key).has_scope("embeddings")


def test_a_reload_after_creating_a_key_neither_creates_another_nor_shows_it_again(client, alice):
    client.force_login(alice)
    response = client.post(reverse("accounts:api_keys"), {"name": "once", "scopes": ["chat"]}, follow=True)
    assert response.redirect_chain == [(reverse("accounts:api_keys"), 302)]
    key = response.context["created"]["key"]
    assert b'id="copy-key"' in response.content
    reloaded = client.get(reverse("accounts:api_keys"))
    assert reloaded.context["created"] is None and key.encode() not in reloaded.content
    assert ApiKey.objects.filter(user=alice).count() == 1
