"""A missing or bad API key reads the same on every API endpoint: 401, `invalid_api_key`, OpenAI's
`invalid_request_error`, so a client handles it once (the official `openai` client raises its
AuthenticationError)."""

from __future__ import annotations

import httpx
import openai
import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from accounts.services import api_key_create, api_key_revoke
from inference.models import Generation

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"

# Every API endpoint, with a method it serves and a body that would be valid with a good key.
ENDPOINTS = {
    "v1/chat/completions": ("POST", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}),
    "v1/completions": ("POST", {"model": MODEL, "prompt": "Hi"}),
    "v1/embeddings": ("POST", {"model": "all-minilm-l6-v2", "input": "Hi"}),
    "v1/models": ("GET", None),
    "v1/models/<str:model_id>": ("GET", None),
    "v1/moderations": ("POST", {"input": "Hi"}),
    "tokenize": ("POST", {"prompt": "Hi"}),
    "detokenize": ("POST", {"tokens": [1]}),
    "api/conversations/": ("GET", None),
    "api/conversations/messages/": ("POST", {"content": "Hi"}),
    "api/conversations/bulk-delete/": ("POST", {"ids": [1]}),
    "api/conversations/bulk-archive/": ("POST", {"ids": [1]}),
    "api/conversations/<int:conversation_id>/archive/": ("POST", None),
    "api/conversations/<int:conversation_id>/": ("GET", None),
    "api/conversations/<int:conversation_id>/messages/": ("POST", {"content": "Hi"}),
    "api/conversations/<int:conversation_id>/branch/": ("POST", {"message": 1}),
    "api/conversations/<int:conversation_id>/settings/": ("PUT", {"temperature": 1}),
    "api/conversations/<int:conversation_id>/messages/<int:message_id>/feedback/": ("PUT", {"rating": "up"}),
    "api/conversations/<int:conversation_id>/files/": ("GET", None),
    "api/conversations/<int:conversation_id>/messages/<int:message_id>/citations/": ("GET", None),
    "api/conversations/<int:conversation_id>/project/": ("PUT", {"project": None}),
    "api/conversations/<int:conversation_id>/tool-approvals/": (
        "POST",
        {"generation": "00000000-0000-0000-0000-000000000000", "call": "call_1", "decision": "deny"},
    ),
    "api/conversations/<int:conversation_id>/stop/": ("POST", {"generation": "00000000-0000-0000-0000-000000000000"}),
    "api/projects/": ("GET", None),
    "api/projects/<int:project_id>/": ("GET", None),
    "api/projects/<int:project_id>/files/": ("GET", None),
    "api/prompts/": ("GET", None),
    "api/prompts/<int:prompt_id>/": ("DELETE", None),
    "api/files/": ("GET", None),
    "api/files/search/": ("GET", None),
    "api/files/<int:document_id>/": ("GET", None),
    "api/files/<int:document_id>/image/": ("GET", None),
    "api/files/<int:document_id>/thumbnail/": ("GET", None),
}
# Served without a key, by design: the API's own description.
OPEN = {"api/schema/", "api/docs/"}


def _routes(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern)


def _url(route: str) -> str:
    return "/" + route.replace("<str:model_id>", MODEL).replace("<int:", "<").replace("<conversation_id>", "1").replace(
        "<message_id>", "1"
    ).replace("<document_id>", "1").replace("<prompt_id>", "1").replace("<project_id>", "1")


def test_the_table_names_every_api_endpoint():
    api = {r for r in _routes(get_resolver().url_patterns) if r.startswith(("v1/", "api/", "tokenize", "detokenize"))}
    assert api - OPEN == set(ENDPOINTS)


@pytest.fixture
def dead_keys(alice):
    revoked = api_key_create(user=alice, name="revoked", scopes=["chat", "models:read", "embeddings"])
    api_key_revoke(user=alice, api_key_id=revoked.api_key.id)
    return {
        "no key": None,
        "an unknown key": "cs_00000000_" + "0" * 43,
        "a revoked key": revoked.key,
        "a key of another service": "sk-proj-abc123",
        "a malformed header": "cs_a b",
    }


async def test_every_api_endpoint_refuses_a_missing_or_bad_key_with_invalid_api_key(server_without_engine, dead_keys):
    refusals = {}
    async with httpx.AsyncClient(base_url=server_without_engine, timeout=60) as client:
        for route, (method, body) in ENDPOINTS.items():
            for name, key in dead_keys.items():
                headers = {} if key is None else {"Authorization": f"Bearer {key}"}
                response = await client.request(method, _url(route), json=body, headers=headers)
                error = response.json()["error"]
                refusals[route, name] = (response.status_code, error["code"], error["type"])
    wrong = {case: got for case, got in refusals.items() if got != (401, "invalid_api_key", "invalid_request_error")}
    assert not wrong
    assert not await Generation.objects.aexists()


async def test_the_official_client_raises_its_authentication_error_on_each_openai_endpoint(
    server_without_engine, dead_keys
):
    client = openai.AsyncOpenAI(
        base_url=f"{server_without_engine}/v1", api_key=dead_keys["an unknown key"], max_retries=0
    )
    calls = {
        "chat": client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}]),
        "completions": client.completions.create(model=MODEL, prompt="Hi"),
        "embeddings": client.embeddings.create(model="all-minilm-l6-v2", input="Hi"),
        "models": client.models.list(),
        "a model": client.models.retrieve(MODEL),
        "moderations": client.moderations.create(input="Hi"),
    }
    codes = {}
    for name, call in calls.items():
        with pytest.raises(openai.AuthenticationError) as refused:
            await call
        codes[name] = refused.value.code
    assert set(codes.values()) == {"invalid_api_key"}
