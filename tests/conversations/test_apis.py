"""The conversations REST API: owners only, scoped keys, cursor pages, and a streamed send."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from types import SimpleNamespace
from unittest.mock import patch

import httpx
import pytest
from channels.db import database_sync_to_async
from rest_framework.test import APIClient

from accounts.models import ApiKey, Tier
from accounts.ratelimit import bucket_consume
from accounts.services import api_key_create
from conversations.models import Conversation, Message
from conversations.requests import SendRequest
from conversations.services import conversation_create, message_send
from inference.models import Generation, ModelDeployment
from tests.helpers.sockets import ended_in_the_database_once_queued, generation_once_finished, stopped_while_streaming

ALL_SCOPES = tuple(ApiKey.Scope.values)
MEGABYTE = "x" * 1_000_000


def client_for(user, scopes=ALL_SCOPES) -> APIClient:
    client = APIClient()
    key = api_key_create(user=user, name="tests", scopes=list(scopes)).key
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def conversation_with_messages(user, title="Plans") -> Conversation:
    conversation = conversation_create(user=user, title=title)
    question = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="Hi?")
    Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT, content="Hello.", parent=question)
    return conversation


def send_url(conversation_id: int | None = None) -> str:
    if conversation_id is None:
        return "/api/conversations/messages/"
    return f"/api/conversations/{conversation_id}/messages/"


def test_it_lists_only_the_callers_conversations_newest_first_in_pages(alice, bob):
    mine = [conversation_create(user=alice, title=f"Chat {i}") for i in range(25)]
    conversation_create(user=bob, title="Bob's")
    client = client_for(alice)
    first = client.get("/api/conversations/", {"limit": 10}).json()
    assert [c["title"] for c in first["results"]] == [f"Chat {i}" for i in range(24, 14, -1)]
    assert first["previous"] is None
    seen = [c["id"] for c in first["results"]]
    page = first
    while page["next"]:
        page = client.get(page["next"]).json()
        seen += [c["id"] for c in page["results"]]
    assert seen == [c.id for c in reversed(mine)]
    assert set(first["results"][0]) == {"id", "title", "model", "project", "created_at", "updated_at", "archived_at"}


@pytest.mark.parametrize(
    ("params", "status", "count"),
    [
        ({"limit": "abc"}, 200, 20),
        ({"limit": "-3"}, 200, 20),
        ({"limit": "100000"}, 200, 25),
        ({"cursor": "bogus"}, 400, None),
    ],
)
def test_bad_pagination_parameters_are_clamped_or_refused(alice, params, status, count):
    for i in range(25):
        conversation_create(user=alice, title=f"Chat {i}")
    response = client_for(alice).get("/api/conversations/", params)
    assert response.status_code == status
    if count is not None:
        assert len(response.json()["results"]) == count
    else:
        assert response.json()["error"]["param"] == "cursor"


def cursor(query: str) -> str:
    return base64.b64encode(query.encode()).decode()


@pytest.mark.parametrize(
    "tampered",
    [
        cursor("o=1&r=1&p=notadate"),
        cursor("o=0&r=0&p=2026-13-45 10:00:00+00:00"),
        cursor("o=0&r=0&p=2026-11-28 10:00:00"),  # no time zone: not what the paginator writes
        cursor("o=0&r=0&p=2026-11-28 10:00:00+00:00\x00"),
        cursor("o=0&r=0&p="),
        cursor("o=0&r=2x"),
    ],
)
def test_a_tampered_cursor_is_a_400_invalid_cursor(alice, tampered):
    for i in range(3):
        conversation_create(user=alice, title=f"Chat {i}")
    response = client_for(alice).get("/api/conversations/", {"cursor": tampered})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "The cursor is invalid.",
        "type": "invalid_request_error",
        "param": "cursor",
        "code": "invalid_cursor",
    }


def test_a_cursor_the_paginator_wrote_still_pages(alice):
    for i in range(3):
        conversation_create(user=alice, title=f"Chat {i}")
    client = client_for(alice)
    first = client.get("/api/conversations/", {"limit": 2}).json()
    second = client.get(first["next"])
    assert second.status_code == 200 and [c["title"] for c in second.json()["results"]] == ["Chat 0"]
    assert client.get(second.json()["previous"]).json()["results"] == first["results"]


def test_it_creates_a_conversation(alice):
    response = client_for(alice).post("/api/conversations/", {"title": " Trip "}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["title"] == "Trip" and body["model"] == "smollm2-135m"
    assert Conversation.objects.get(id=body["id"]).user == alice


@pytest.mark.parametrize(
    "body",
    [{"title": 42}, {"title": ["a"]}, {"title": "x" * 201}, {"model": "no-such-model"}, {"model": 7}, [1, 2]],
)
def test_a_bad_create_is_refused_and_creates_nothing(alice, body):
    response = client_for(alice).post("/api/conversations/", body, format="json")
    assert 400 <= response.status_code < 500
    assert "error" in response.json()
    assert not Conversation.objects.exists()


def test_a_model_the_plan_does_not_include_is_refused(alice):
    ModelDeployment.objects.create(name="big-model", model="Big", max_context=8192, default_max_tokens=4096)
    client = client_for(alice)
    for url in ("/api/conversations/", send_url()):
        response = client.post(url, {"title": "Big", "content": "Hi", "model": "big-model"}, format="json")
        assert response.status_code == 403 and response.json()["error"]["code"] == "model_not_allowed"
    assert not Conversation.objects.exists()


def test_it_retrieves_a_conversation_with_its_messages(alice):
    conversation = conversation_with_messages(alice)
    body = client_for(alice).get(f"/api/conversations/{conversation.id}/").json()
    assert body["id"] == conversation.id and body["title"] == "Plans"
    assert [(m["role"], m["content"], m["status"]) for m in body["messages"]] == [
        ("user", "Hi?", "complete"),
        ("assistant", "Hello.", "complete"),
    ]


def test_it_renames_a_conversation(alice):
    conversation = conversation_with_messages(alice)
    response = client_for(alice).patch(f"/api/conversations/{conversation.id}/", {"title": "Holiday"}, format="json")
    assert response.status_code == 200 and response.json()["title"] == "Holiday"
    conversation.refresh_from_db()
    assert conversation.title == "Holiday"


@pytest.mark.parametrize(
    "body", [{}, {"title": ""}, {"title": "   "}, {"title": 5}, {"title": MEGABYTE}, {"title": None}]
)
def test_a_bad_rename_is_refused_and_changes_nothing(alice, body):
    conversation = conversation_with_messages(alice)
    response = client_for(alice).patch(f"/api/conversations/{conversation.id}/", body, format="json")
    assert response.status_code == 400
    conversation.refresh_from_db()
    assert conversation.title == "Plans"


def test_invalid_utf8_and_broken_json_are_refused(alice):
    conversation = conversation_with_messages(alice)
    client = client_for(alice)
    for body in (b'{"title": "\xff\xfe"}', b"{not json"):
        response = client.generic("PATCH", f"/api/conversations/{conversation.id}/", body, "application/json")
        assert response.status_code == 400
        response = client.generic("POST", send_url(conversation.id), body, "application/json")
        assert response.status_code == 400
    conversation.refresh_from_db()
    assert conversation.title == "Plans" and conversation.messages.count() == 2


def test_it_deletes_a_conversation(alice):
    conversation = conversation_with_messages(alice)
    response = client_for(alice).delete(f"/api/conversations/{conversation.id}/")
    assert response.status_code == 204
    assert not Conversation.objects.filter(id=conversation.id).exists()
    assert not Message.objects.exists()


def test_another_users_conversation_is_not_found_through_every_endpoint(alice, mallory):
    conversation = conversation_with_messages(alice)
    client = client_for(mallory)
    url = f"/api/conversations/{conversation.id}/"
    responses = [
        client.get(url),
        client.patch(url, {"title": "Mine now"}, format="json"),
        client.delete(url),
        client.post(send_url(conversation.id), {"content": "Let me in"}, format="json"),
    ]
    assert [r.status_code for r in responses] == [404, 404, 404, 404]
    assert all(r.json()["error"]["code"] == "not_found" for r in responses)
    assert conversation.id not in [c["id"] for c in client.get("/api/conversations/").json()["results"]]
    conversation.refresh_from_db()
    assert conversation.title == "Plans" and conversation.messages.count() == 2


def test_a_missing_or_enormous_id_is_not_found(alice):
    client = client_for(alice)
    for conversation_id in (999, 2**70):
        assert client.get(f"/api/conversations/{conversation_id}/").status_code == 404
        assert client.post(send_url(conversation_id), {"content": "Hi"}, format="json").status_code == 404


def test_each_endpoint_needs_its_scope(alice):
    conversation = conversation_with_messages(alice)
    url = f"/api/conversations/{conversation.id}/"
    reader = client_for(alice, scopes=["conversations:read"])
    writer = client_for(alice, scopes=["conversations:write"])
    chatter = client_for(alice, scopes=["chat"])
    assert reader.get("/api/conversations/").status_code == 200
    assert reader.get(url).status_code == 200
    refused = [
        writer.get("/api/conversations/"),
        writer.get(url),
        reader.post("/api/conversations/", {}, format="json"),
        reader.patch(url, {"title": "No"}, format="json"),
        reader.delete(url),
        reader.post(send_url(conversation.id), {"content": "Hi"}, format="json"),
        writer.post(send_url(), {"content": "Hi"}, format="json"),
        chatter.get("/api/conversations/"),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused)
    assert all(r.json()["error"]["type"] == "permission_error" for r in refused)
    conversation.refresh_from_db()
    assert conversation.title == "Plans" and Conversation.objects.count() == 1 and Message.objects.count() == 2


def test_it_needs_authentication(alice):
    conversation = conversation_with_messages(alice)
    client = APIClient()
    assert client.get("/api/conversations/").status_code == 401
    assert client.post(send_url(conversation.id), {"content": "Hi"}, format="json").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Bearer cs_nope_nope")
    assert client.get("/api/conversations/").status_code == 401


def test_a_session_works_and_a_session_send_needs_the_csrf_token(alice):
    conversation = conversation_with_messages(alice)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get("/api/conversations/").json()["results"][0]["id"] == conversation.id
    response = client.post(send_url(conversation.id), {"content": "Hi"}, format="json")
    assert response.status_code == 403 and response.json()["error"]["code"] == "csrf_failed"
    assert conversation.messages.count() == 2
    client.cookies["csrftoken"] = TOKEN
    response = client.post(send_url(conversation.id), {"content": " "}, format="json", HTTP_X_CSRFTOKEN=TOKEN)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_message"


TOKEN = "a" * 32


@pytest.mark.parametrize(
    "body",
    [{"content": ""}, {"content": "   "}, {"content": 42}, {"content": None}, {}, {"content": MEGABYTE}, ["Hi"]],
)
def test_a_bad_message_is_refused_before_streaming_and_leaves_nothing_behind(alice, body):
    conversation = conversation_with_messages(alice)
    client = client_for(alice)
    for url in (send_url(conversation.id), send_url()):
        response = client.post(url, body, format="json")
        assert response.status_code == 400
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert Conversation.objects.count() == 1 and Message.objects.count() == 2
    assert not Generation.objects.exists()


@pytest.mark.parametrize("client_id", ["not-a-uuid", 42, True, ""])
def test_a_client_id_that_is_not_a_uuid_is_refused_and_leaves_nothing_behind(alice, client_id):
    response = client_for(alice).post(send_url(), {"content": "Hi", "client_id": client_id}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "client_id"
    assert not Conversation.objects.exists() and not Generation.objects.exists()


def test_another_users_client_id_is_refused_without_a_word_about_whose_it_is(alice, mallory):
    client_id = str(uuid.uuid4())
    message_send(user=alice, request=SendRequest(content="Alice's message", client_id=uuid.UUID(client_id)))
    response = client_for(mallory).post(send_url(), {"content": "Mine now?", "client_id": client_id}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "client_id" and "Alice" not in error["message"]
    assert not Conversation.objects.filter(user=mallory).exists()
    assert Message.objects.count() == 2 and Generation.objects.count() == 1


def test_a_body_beyond_the_upload_limit_is_refused(alice):
    conversation = conversation_with_messages(alice)
    response = client_for(alice).post(send_url(conversation.id), {"content": MEGABYTE * 3}, format="json")
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert conversation.messages.count() == 2


def test_a_send_while_an_answer_is_written_is_a_conflict(alice):
    conversation = conversation_with_messages(alice)
    Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT, status=Message.Status.STREAMING)
    response = client_for(alice).post(send_url(conversation.id), {"content": "And?"}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "generation_in_progress"
    assert conversation.messages.count() == 3


def test_a_send_to_an_unknown_model_is_not_found(alice):
    response = client_for(alice).post(send_url(), {"content": "Hi", "model": "gpt-17"}, format="json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert not Conversation.objects.exists()


def test_only_post_sends(alice):
    assert client_for(alice).get(send_url()).status_code == 405


def sse_events(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.django_db(transaction=True)
async def test_a_message_streams_its_answer_and_is_saved_complete(chat_server, alice):
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    async with (
        httpx.AsyncClient(base_url=chat_server, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client,
        client.stream("POST", send_url(), json={"content": "Say hello in one short sentence."}) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join([chunk async for chunk in response.aiter_text()])
    events = sse_events(text)
    names = [name for name, _ in events]
    assert names[0] == "message.accepted" and names[-1] == "done"
    assert set(names[1:-1]) == {"delta"}
    seqs = [data["seq"] for name, data in events[1:]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    accepted, done = events[0][1], events[-1][1]
    assert accepted["conversation_created"] is True
    assert done["finish_reason"] in ("stop", "length") and done["message"] == accepted["assistant_message"]
    streamed = "".join(data["text"] for name, data in events if name == "delta")
    assert streamed.strip()
    answer = await Message.objects.aget(id=accepted["assistant_message"])
    assert answer.status == Message.Status.COMPLETE
    assert answer.content == streamed


async def _send_and_read(server: str, key: str, body: dict) -> list[tuple[str, dict]]:
    async with (
        httpx.AsyncClient(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client,
        client.stream("POST", send_url(), json=body) as response,
    ):
        assert response.status_code == 200
        return sse_events("".join([chunk async for chunk in response.aiter_text()]))


def _connections_to_this_database() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


@pytest.mark.topology
@pytest.mark.django_db(transaction=True)
async def test_open_answer_streams_hold_no_database_connection_each(chat_server, alice):
    """A send runs on the process's database threads, as the chat socket's and `/v1`'s do: an
    answer that streams holds no connection of its own meanwhile, so a hundred open streams do not
    take more connections than PostgreSQL allows (they did, each in its request's own thread)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("counts PostgreSQL's connections")
    await Tier.objects.aupdate(requests_per_minute=None, tokens_per_minute=None, tokens_per_day=None)
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    # The database threads, opened at once: as many as the streams below could use.
    await asyncio.gather(*(_send_and_read(chat_server, key, {"content": "Hello"}) for _ in range(8)))
    before = await database_sync_to_async(_connections_to_this_database)()
    done = asyncio.Event()

    async def streaming(client: httpx.AsyncClient, opened: asyncio.Event) -> None:
        async with client.stream("POST", send_url(), json={"content": "Go on. [write on]"}) as response:
            assert response.status_code == 200, await response.aread()
            text = ""
            async for chunk in response.aiter_text():
                text += chunk
                if "event: delta" in text:
                    opened.set()
                    await done.wait()
                    return

    async with httpx.AsyncClient(
        base_url=chat_server, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as client:
        opened = [asyncio.Event() for _ in range(12)]
        streams = [asyncio.ensure_future(streaming(client, event)) for event in opened]
        try:
            await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), timeout=60)
            during = await database_sync_to_async(_connections_to_this_database)()
        finally:
            done.set()
            for failed in [r for r in await asyncio.gather(*streams, return_exceptions=True) if r is not None]:
                raise failed
    assert during - before <= 3  # twelve answers streaming: not a connection each


@pytest.mark.django_db(transaction=True)
async def test_a_send_repeated_with_its_client_id_is_saved_and_answered_once(chat_server, alice):
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    body = {"content": "Say hello in one short sentence.", "client_id": str(uuid.uuid4())}
    first = await _send_and_read(chat_server, key, body)
    again = await _send_and_read(chat_server, key, body)
    assert first[0][1]["replayed"] is False and again[0][1]["replayed"] is True
    for field in ("conversation", "user_message", "assistant_message", "generation"):
        assert again[0][1][field] == first[0][1][field]
    assert again[0][1]["conversation_created"] is True  # told again, for a client that missed it
    assert [name for name, _ in again] == [name for name, _ in first]
    assert again[-1][1]["finish_reason"] == first[-1][1]["finish_reason"]
    text = "".join(data["text"] for name, data in first if name == "delta")
    assert "".join(data["text"] for name, data in again if name == "delta") == text
    assert await Conversation.objects.filter(user=alice).acount() == 1
    assert await Message.objects.filter(conversation__user=alice).acount() == 2
    assert await Generation.objects.filter(user=alice).acount() == 1


@pytest.mark.django_db(transaction=True)
async def test_a_send_repeated_after_its_answer_is_gone_from_the_buffer_gets_it_whole_from_the_row(
    chat_server, alice, monkeypatch
):
    from inference.streaming.streams import replay_buffer

    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    body = {"content": "Say hello in one short sentence.", "client_id": str(uuid.uuid4())}
    first = await _send_and_read(chat_server, key, body)

    async def expired(generation_id, after_seq):
        return []

    monkeypatch.setattr(replay_buffer(), "read", expired)
    again = await _send_and_read(chat_server, key, body)
    assert [name for name, _ in again] == ["message.accepted", "done"]
    accepted, done = again[0][1], again[1][1]
    assert accepted["replayed"] is True and accepted["assistant_message"] == first[0][1]["assistant_message"]
    assert done["text"] == "".join(data["text"] for name, data in first if name == "delta")
    assert done["status"] == "complete" and done["finish_reason"] == first[-1][1]["finish_reason"]
    assert done["usage"] == first[-1][1]["usage"]
    assert await Generation.objects.filter(user=alice).acount() == 1


@pytest.mark.django_db(transaction=True)
async def test_a_client_that_disconnects_stops_the_answer(chat_server, alice):
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()

    async def leave_after_two_deltas() -> tuple[tuple[float, float], bool]:
        async with (
            httpx.AsyncClient(base_url=chat_server, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client,
            client.stream(
                "POST", send_url(), json={"content": "Write a very long story about the sea. [write on]"}
            ) as response,
        ):
            sent_at = time.monotonic()
            deltas = 0
            async for line in response.aiter_lines():
                deltas += line == "event: delta"
                if deltas >= 2:
                    break
            running = not (await Generation.objects.filter(user=alice).afirst()).is_finished
        return (sent_at, time.monotonic()), running

    sent_at, left_at = await stopped_while_streaming(leave_after_two_deltas)
    generation = await generation_once_finished(alice)
    assert generation.status == Generation.Status.STOPPED, (
        f"second delta {left_at - sent_at:.2f} s after the send; the answer then ended"
        f" {generation.status} after {generation.completion_tokens} tokens"
    )
    answer = await Message.objects.aget(generation=generation)
    assert answer.status == Message.Status.STOPPED


def _sent(generation: Generation) -> SimpleNamespace:
    """What message_send returns, for an answer whose generation a test made itself."""
    return SimpleNamespace(
        generation=generation,
        conversation=SimpleNamespace(id=1),
        conversation_created=True,
        user_message=SimpleNamespace(id=1),
        assistant_message=SimpleNamespace(id=2),
        warning="",
        replayed=False,
        tools=None,
    )


@pytest.mark.django_db(transaction=True)
async def test_an_answer_stream_closed_at_one_of_its_yields_stops_the_answer(unclaimed_generation):
    """A client that goes away ends the response either by cancelling it inside the stream or by
    closing it at the event it waits to send: either way the answer is stopped."""
    from conversations.apis import _stream
    from inference.streaming.streams import StreamPublisher

    generation = unclaimed_generation
    sent = _sent(generation)
    stream = _stream(sent)
    assert (await anext(stream)).startswith("event: message.accepted")
    await StreamPublisher(generation.id, coalesce_ms=0).add_text("Hello")
    assert (await anext(stream)).startswith("event: delta")
    await stream.aclose()
    generation = await Generation.objects.aget(id=generation.id)
    assert generation.stop_requested
    assert generation.status == Generation.Status.STOPPED


@pytest.mark.django_db(transaction=True)
async def test_an_answer_stream_that_hears_nothing_ends_with_a_timeout_error_and_stops_the_answer(
    unclaimed_generation, followers_give_up_at_once
):
    from conversations.apis import _stream

    generation = unclaimed_generation
    sent = _sent(generation)
    events = [event async for event in _stream(sent)]
    assert events[0].startswith("event: message.accepted")
    assert events[-1].startswith("event: error")
    assert json.loads(events[-1].split("data: ", 1)[1])["code"] == "timeout"
    generation = await Generation.objects.aget(id=generation.id)
    assert generation.status == Generation.Status.STOPPED


@pytest.mark.django_db(transaction=True)
async def test_an_answer_ended_without_an_event_still_ends_its_event_stream(
    server_without_engine, alice, monkeypatch, settings
):
    """Its row says it ended: the stream reads the row once it has been quiet a while, and ends with
    the row's end instead of waiting out an answer's time limit."""
    settings.INFERENCE_STREAM_RESYNC_S = 0.2
    # No engine runs it.
    monkeypatch.setattr("inference.services.generation_dispatch", lambda **dispatch: None)
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    ending = asyncio.ensure_future(
        ended_in_the_database_once_queued(
            alice, status=Generation.Status.FAILED, error_code="worker_lost", error_message="The server stopped."
        )
    )

    events = await asyncio.wait_for(_send_and_read(server_without_engine, key, {"content": "Say hello."}), 10)

    generation = await ending
    assert [name for name, _ in events] == ["message.accepted", "error"]
    assert events[0][1]["generation"] == str(generation.id)
    assert (events[1][1]["code"], events[1][1]["message"]) == ("worker_lost", "The server stopped.")


def test_starting_conversations_past_the_plans_hourly_limit_is_refused(alice):
    Tier.objects.filter(name="free").update(conversations_per_hour=2)
    session = APIClient()
    session.force_login(alice)
    client = client_for(alice)  # the session and the key share the user's limit
    assert session.post("/api/conversations/", {}, format="json").status_code == 201
    assert client.post("/api/conversations/", {}, format="json").status_code == 201
    refused = client.post("/api/conversations/", {}, format="json")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 1800
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limited")
    assert "limit of 2 new conversations an hour" in error["message"]
    assert Conversation.objects.filter(user=alice).count() == 2


@pytest.mark.parametrize("into_a_conversation", [False, True])
def test_a_message_too_long_for_the_window_is_refused_before_any_work(alice, into_a_conversation):
    # A plan that caps the window at 2,048 tokens, which one message's characters can overflow.
    Tier.objects.filter(name="free").update(requests_per_minute=1, max_context=2048)
    conversation = conversation_with_messages(alice)
    huge = "word " * 6_000  # 30,000 characters: within a message's limit, far beyond 2,048 tokens
    url = send_url(conversation.id if into_a_conversation else None)
    with (
        patch("moderation.services.score_many", side_effect=AssertionError("scored")) as scoring,
        patch("conversations.services.sending.count_tokens", side_effect=AssertionError("tokenized")) as tokenizing,
        patch(
            "conversations.services.conversations.count_tokens", side_effect=AssertionError("tokenized")
        ) as measuring,
    ):
        response = client_for(alice).post(url, {"content": huge}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert not scoring.called and not tokenizing.called and not measuring.called
    assert Conversation.objects.count() == 1 and Message.objects.count() == 2
    assert not Generation.objects.exists()
    assert bucket_consume(key=f"user:{alice.id}:requests", capacity=1, period_s=60).allowed  # untouched
