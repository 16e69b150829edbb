"""Security headers: a strict Content-Security-Policy on every page, and private answers no shared cache keeps.

Browsers enforcing the policy are tested in tests/browser/test_content_security_policy.py; these
tests read the headers the application sends, through the sync and the async request paths.
"""

from __future__ import annotations

import httpx
import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient, Client

from accounts.models import ApiKey
from accounts.services import api_key_create
from conversations.services import conversation_create
from tests.chatsite.test_static_files import asgi_get


def directives(header: str) -> dict[str, list[str]]:
    parsed = {}
    for part in header.split(";"):
        name, *values = part.split()
        parsed[name] = values
    return parsed


def assert_not_stored(response) -> None:
    cache_control = {part.strip() for part in response["Cache-Control"].split(",")}
    assert {"no-store", "private"} <= cache_control
    vary = {part.strip().lower() for part in response["Vary"].split(",")}
    assert {"cookie", "authorization"} <= vary


def key_client(user) -> Client:
    key = api_key_create(user=user, name="headers", scopes=list(ApiKey.Scope.values)).key
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


# --- Content-Security-Policy -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/accounts/login/", "/accounts/signup/", "/api/docs/"])
def test_public_pages_allow_scripts_and_styles_from_the_site_only(client, db, path):
    response = client.get(path)
    assert response.status_code == 200
    policy = directives(response["Content-Security-Policy"])
    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["img-src"] == ["'self'", "data:"]
    assert policy["object-src"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"]
    assert policy["form-action"] == ["'self'"]
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]
    assert "'unsafe-eval'" not in response["Content-Security-Policy"]


def test_the_chat_page_may_open_its_socket_on_its_own_host_only(client, alice):
    client.force_login(alice)
    plain = directives(client.get("/", HTTP_HOST="localhost")["Content-Security-Policy"])
    assert plain["connect-src"] == ["'self'", "ws://localhost"]
    secure = directives(client.get("/", HTTP_HOST="localhost", secure=True)["Content-Security-Policy"])
    assert secure["connect-src"] == ["'self'", "wss://localhost"]


def test_a_request_for_an_unknown_host_is_refused_without_naming_it_in_the_policy(client, db):
    response = client.get("/accounts/login/", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert "evil.example" not in response.get("Content-Security-Policy", "")


def test_no_page_the_site_renders_has_inline_script_or_style(client, alice):
    """The policy refuses them, so one would break its page: handlers live in static files."""
    conversation = conversation_create(user=alice, title="Plans")
    client.force_login(alice)
    for path in ["/", f"/c/{conversation.id}/", "/accounts/usage/", "/accounts/keys/"]:
        html = client.get(path).content.decode()
        assert "<script>" not in html and "<style" not in html, path
        assert " style=" not in html and " onsubmit=" not in html and " onclick=" not in html, path


def test_the_api_docs_start_up_script_is_a_file_of_its_own(client, db):
    page = client.get("/api/docs/").content.decode()
    assert '<script src="/api/docs/?script="></script>' in page
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert b"SwaggerUIBundle" in script.content


# --- private answers are not stored ----------------------------------------------------------------


def test_a_signed_in_persons_pages_and_api_answers_are_not_stored(client, alice):
    conversation = conversation_create(user=alice, title="Plans")
    client.force_login(alice)
    for path in [
        "/",
        f"/c/{conversation.id}/",
        "/accounts/usage/",
        "/accounts/usage/statement.csv",
        "/accounts/keys/",
        "/api/conversations/",
        f"/api/conversations/{conversation.id}/",
    ]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert_not_stored(response)


def test_answers_to_an_api_key_are_not_stored(alice):
    conversation = conversation_create(user=alice, title="Plans")
    client = key_client(alice)
    for path in ["/api/conversations/", f"/api/conversations/{conversation.id}/", "/v1/models"]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert_not_stored(response)
    # Refusals from the streaming views too: they come before any stream starts.
    refused = client.post(
        f"/api/conversations/{conversation.id}/messages/", data={"content": ""}, content_type="application/json"
    )
    assert refused.status_code == 400
    assert_not_stored(refused)


@pytest.mark.django_db(transaction=True)
async def test_the_async_path_marks_private_answers_too(alice):
    conversation = await database_sync_to_async(conversation_create)(user=alice, title="Plans")
    client = AsyncClient()
    await client.aforce_login(alice)
    for path in [f"/c/{conversation.id}/", f"/api/conversations/{conversation.id}/"]:
        response = await client.get(path)
        assert response.status_code == 200, path
        assert_not_stored(response)
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    refused = await AsyncClient().post(
        "/v1/chat/completions",
        data={"messages": []},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert refused.status_code == 400
    assert_not_stored(refused)


def test_a_page_a_view_already_marks_keeps_its_own_cache_control(client, alice):
    client.force_login(alice)
    response = client.get("/accounts/keys/")  # never_cache: max-age=0, no-cache, no-store, ...
    assert response["Cache-Control"].startswith("max-age=0")
    assert "no-store" in response["Cache-Control"]


def test_an_anonymous_public_page_is_left_to_its_view(client, db):
    response = client.get("/api/docs/")
    assert "no-store" not in response.get("Cache-Control", "")
    assert "authorization" not in response.get("Vary", "").lower()


async def test_a_static_file_keeps_its_caching_for_a_signed_in_person():
    status, headers, _ = await asgi_get(
        "/static/chat.js", headers=[(b"cookie", b"sessionid=abc"), (b"authorization", b"Bearer cs_x")]
    )
    assert status == 200
    assert b"max-age=" in headers[b"cache-control"]
    assert b"no-store" not in headers[b"cache-control"]
    assert b"private" not in headers[b"cache-control"]
    assert b"cookie" not in headers.get(b"vary", b"").lower()


@pytest.mark.django_db(transaction=True)
async def test_a_streamed_completion_is_not_stored(chat_server, alice):
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi."}], "stream": True, "max_tokens": 4}
    async with (
        httpx.AsyncClient(base_url=chat_server, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert {"no-store", "private", "no-cache"} <= {p.strip() for p in response.headers["cache-control"].split(",")}
        assert {"cookie", "authorization"} <= {p.strip().lower() for p in response.headers["vary"].split(",")}
        async for _ in response.aiter_bytes():
            pass
