"""Every request body goes through one JSON parser (chatsite/parsers.py): strict JSON, nesting bounded,
a body over the upload limit a 413, each refusal in the APIs' error shape and changing nothing."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from channels.db import database_sync_to_async

from accounts.models import ApiKey
from accounts.services import api_key_create
from billing.models import UsageRecord
from chatsite.errors import ClientError
from chatsite.parsers import JSON_MAX_DEPTH, json_parse
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from inference.models import Generation

pytestmark = pytest.mark.django_db(transaction=True)

DEEP_ARRAYS = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECTS = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
# Just within the parser's recursion, far beyond what any endpoint reads.
DEEP_BUT_PARSEABLE = json.dumps({"title": "x", "model": None, "extra": json.loads("[" * 500 + "]" * 500)}).encode()
FIVE_MEGABYTES = json.dumps({"content": "x" * 5_000_000, "title": "x", "input": "x"}).encode()


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value", [nested(1), nested(JSON_MAX_DEPTH), {"a": {"b": nested(JSON_MAX_DEPTH - 2)}}, 7, None]
)
def test_json_within_the_depth_limit_parses(value):
    assert json_parse(json.dumps(value)) == value


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps(nested(JSON_MAX_DEPTH + 1)),
        json.dumps({"a": {"b": nested(JSON_MAX_DEPTH - 1)}}),
        DEEP_ARRAYS,
        DEEP_OBJECTS,
    ],
)
def test_json_nested_beyond_the_limit_is_refused(raw):
    with pytest.raises(ClientError) as refused:
        json_parse(raw)
    assert (refused.value.code, refused.value.status) == ("json_too_deep", 400)


@pytest.mark.parametrize(
    "raw", ["NaN", '{"a": Infinity}', "[-Infinity]", "1" * 5000, b"\xff\xfe", "", "{", "[1,]", '{"a" 1}']
)
def test_what_is_not_strict_json_is_refused(raw):
    with pytest.raises(ClientError) as refused:
        json_parse(raw)
    assert (refused.value.code, refused.value.status) == ("invalid_json", 400)


@pytest.fixture
async def api(alice):
    """The real ASGI application, in this process, with an API key of alice's with every scope."""
    from chatsite.asgi import application

    key = (await database_sync_to_async(api_key_create)(user=alice, name="t", scopes=list(ApiKey.Scope.values))).key
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://localhost", headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as client:
        yield client


@pytest.fixture
async def alices_conversation(alice):
    return await database_sync_to_async(conversation_create)(user=alice, title="Plans")


def endpoints(conversation_id: int) -> list[tuple[str, str]]:
    return [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/moderations"),
        ("POST", "/api/conversations/"),
        ("PATCH", f"/api/conversations/{conversation_id}/"),
        ("POST", "/api/conversations/messages/"),
        ("POST", f"/api/conversations/{conversation_id}/messages/"),
    ]


async def rows() -> tuple[int, ...]:
    return (
        await Conversation.objects.acount(),
        await Message.objects.acount(),
        await Generation.objects.acount(),
        await UsageRecord.objects.acount(),
    )


def assert_api_error(response: httpx.Response, *, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", code)


@pytest.mark.parametrize("body", [DEEP_ARRAYS, DEEP_OBJECTS, DEEP_BUT_PARSEABLE], ids=["arrays", "objects", "500"])
async def test_deeply_nested_json_is_a_400_on_every_endpoint(api, alices_conversation, body):
    before = await rows()
    for method, url in endpoints(alices_conversation.id):
        response = await api.request(method, url, content=body, headers={"Content-Type": "application/json"})
        assert_api_error(response, status=400, code="json_too_deep")
    assert await rows() == before
    assert (await Conversation.objects.aget()).title == "Plans"


async def test_a_body_over_the_upload_limit_is_a_413_in_the_api_shape_on_every_endpoint(api, alices_conversation):
    before = await rows()
    for method, url in endpoints(alices_conversation.id):
        response = await api.request(method, url, content=FIVE_MEGABYTES, headers={"Content-Type": "application/json"})
        assert_api_error(response, status=413, code="request_too_large")
    assert await rows() == before


async def test_a_form_body_is_refused_as_an_unsupported_media_type(api, alices_conversation):
    response = await api.patch(f"/api/conversations/{alices_conversation.id}/", data={"title": "Renamed"})
    assert_api_error(response, status=415, code="unsupported_media_type")
    assert (await Conversation.objects.aget()).title == "Plans"


async def test_the_openai_client_hears_deep_json_as_a_bad_request(api):
    client = openai.AsyncOpenAI(
        base_url="http://localhost/v1",
        api_key=api.headers["Authorization"].removeprefix("Bearer "),
        http_client=httpx.AsyncClient(transport=api._transport),
        max_retries=0,
    )
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "system", "content": "Be brief."}],
            extra_body={"metadata": nested(JSON_MAX_DEPTH + 1)},
        )
    assert refused.value.code == "json_too_deep"
    assert not await Generation.objects.aexists()
