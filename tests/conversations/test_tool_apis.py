"""The service's tools through the conversations REST API: a send's event stream drives the tool loop
(conversations.tool_streams), and a call with side effects is answered by its own endpoint. On the
scripted engine, which calls a tool when the newest user turn says `[call <name>]` or the request
forces a call; in the embedded run and (marked `topology`) with the answers written by a Celery worker."""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from contextlib import asynccontextmanager

import httpx
import pytest
from channels.db import database_sync_to_async
from django.test import override_settings
from rest_framework.test import APIClient

from accounts.services import api_key_create
from billing.models import UsageRecord
from conversations import tool_streams
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from inference.models import Generation
from inference.streaming import streams
from tests.conversations.test_apis import TOKEN, send_url, sse_events
from tests.orchestration.tools import Echo, Hanging, Sending

pytestmark = pytest.mark.django_db(transaction=True)


async def key_for(user) -> str:
    return (await database_sync_to_async(api_key_create)(user=user, name="tests", scopes=["chat"])).key


def approval_url(conversation_id: int) -> str:
    return f"/api/conversations/{conversation_id}/tool-approvals/"


def stop_url(conversation_id: int) -> str:
    return f"/api/conversations/{conversation_id}/stop/"


def of_event(events, name):
    return [data for kind, data in events if kind == name]


class Stream:
    """A send's event stream read event by event, so that a test can answer in the middle of it."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()
        self.events: list[tuple[str, dict]] = []

    async def next(self, *, timeout: float = 60) -> tuple[str, dict]:
        event, data = "", ""
        while True:
            line = await asyncio.wait_for(anext(self.lines), timeout)
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
            elif line == "" and event:
                self.events.append((event, json.loads(data)))
                return self.events[-1]

    async def until(self, name: str) -> dict:
        while True:
            kind, data = await self.next()
            if kind == name:
                return data

    async def rest(self) -> list[tuple[str, dict]]:
        """Every event to the answer's end, and nothing after it."""
        while (await self.next())[0] not in ("done", "error", "tool.stopped"):
            pass
        assert [line async for line in self.lines] == []
        return self.events


async def send(server: str, key: str, body: dict, conversation_id: int | None = None) -> list[tuple[str, dict]]:
    async with (
        httpx.AsyncClient(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client,
        client.stream("POST", send_url(conversation_id), json=body) as response,
    ):
        assert response.status_code == 200, await response.aread()
        return sse_events("".join([chunk async for chunk in response.aiter_text()]))


@pytest.mark.topology
async def test_a_tool_call_its_result_and_the_answer_stream_and_are_saved_and_billed(chat_server, alice, granted_tools):
    echo = await granted_tools(Echo())
    events = await send(chat_server, await key_for(alice), {"content": "[call echo] what is new?", "tools": True})
    names = [name for name, _ in events]
    assert names[0] == "message.accepted" and names[-1] == "done"
    assert (
        names.index("tool.calls") < names.index("tool.running") < names.index("tool.result") < names.index("tool.step")
    )
    accepted = events[0][1]
    assert "echo" in accepted["tools"]["names"] and accepted["tools"]["forced"] is None
    [calls] = of_event(events, "tool.calls")
    assert [c["name"] for c in calls["calls"]] == ["echo"] and calls["generation"] == accepted["generation"]
    [result] = of_event(events, "tool.result")
    assert result["outcome"] == "ok" and result["output"] == "The echo heard: scripted"
    [step] = of_event(events, "tool.step")
    assert step["step"] == 2 and step["assistant_message"]["parent"] == result["message"]
    done = events[-1][1]
    assert done["message"] == step["assistant_message"]["id"] and done["status"] == "complete"
    # The call's text never streams; the answer in words quotes the tool's turn.
    shown = "".join(data["text"] for name, data in events if name == "delta")
    assert "<tool_call>" not in shown and "The result of the tool echo" in shown
    assert echo.runs == [{"text": "scripted"}]

    user, first, tool, final = [
        m async for m in Message.objects.filter(conversation_id=accepted["conversation"]).order_by("id")
    ]
    assert (user.role, first.role, tool.role, final.role) == ("user", "assistant", "tool", "assistant")
    assert first.parent_id == user.id and tool.parent_id == first.id and final.parent_id == tool.id
    assert first.finish_reason == "tool_calls" and tool.tool_call_id == first.tool_calls[0]["id"]
    assert final.id == done["message"] and final.status == "complete"
    assert (await Conversation.objects.aget(id=accepted["conversation"])).tools_enabled is True
    billed = {str(r.generation_id) async for r in UsageRecord.objects.filter(kind="generation")}
    assert billed == {accepted["generation"], step["generation"]}


async def test_a_tool_asked_for_by_name_is_called_first(chat_server, alice, granted_tools):
    echo = await granted_tools(Echo())
    events = await send(chat_server, await key_for(alice), {"content": "hello there", "tool": "echo"})
    assert events[0][1]["tools"]["forced"] == "echo"
    assert of_event(events, "tool.result")[0]["outcome"] == "ok" and len(echo.runs) == 1
    assert events[-1][0] == "done"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"content": "hello", "tool": "nothing_of_the_kind"}, "tool_unavailable"),
        ({"content": "hello", "tool": "not a name!"}, "invalid_request"),
        ({"content": "hello", "tool": 7}, "invalid_request"),
        ({"content": "hello", "tools": "yes"}, "invalid_request"),
    ],
)
async def test_a_tool_that_cannot_be_asked_for_is_refused_and_nothing_is_saved(
    server_without_engine, alice, granted_tools, body, code
):
    await granted_tools(Echo())
    async with httpx.AsyncClient(base_url=server_without_engine, timeout=30) as client:
        response = await client.post(send_url(), json=body, headers={"Authorization": f"Bearer {await key_for(alice)}"})
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert not await Conversation.objects.aexists() and not await Message.objects.aexists()
    assert not await Generation.objects.aexists()


async def test_with_the_tools_off_the_answer_is_offered_none(chat_server, alice, granted_tools):
    echo = await granted_tools(Echo())
    events = await send(chat_server, await key_for(alice), {"content": "[call echo] hi"})
    assert "tools" not in events[0][1] and [name for name, _ in events][-1] == "done"
    assert not of_event(events, "tool.calls") and echo.runs == []


@asynccontextmanager
async def streaming(server: str, key: str, body: dict):
    """A send whose stream the test reads as it goes, with a client for its other requests."""
    async with (
        httpx.AsyncClient(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client,
        client.stream("POST", send_url(), json=body) as response,
    ):
        assert response.status_code == 200
        yield Stream(response), client


@asynccontextmanager
async def asking_first(server: str, user):
    """A send whose answer calls `send_note`, a tool with side effects, read until its question:
    the stream, a client for the other requests, `message.accepted` and `tool.approval`."""
    body = {"content": "[call send_note] x", "tools": True}
    async with streaming(server, await key_for(user), body) as (stream, client):
        accepted = await stream.until("message.accepted")
        approval = await stream.until("tool.approval")
        yield stream, client, accepted, approval


@pytest.mark.topology
async def test_a_call_with_side_effects_waits_for_the_approval_endpoint_and_runs_when_allowed(
    chat_server, alice, granted_tools
):
    sending = await granted_tools(Sending())
    async with asking_first(chat_server, alice) as (stream, client, accepted, approval):
        assert approval["call"]["name"] == "send_note" and approval["call"]["arguments"] == '{"text": "scripted"}'
        assert approval["generation"] == accepted["generation"] and sending.runs == []
        answer = {"generation": approval["generation"], "call": approval["call"]["id"], "decision": "once"}
        response = await client.post(approval_url(accepted["conversation"]), json=answer)
        assert response.status_code == 200 and response.json() == answer
        events = await stream.rest()
    names = [name for name, _ in events]
    assert (
        names.index("tool.approval") < names.index("tool.running") < names.index("tool.result") and names[-1] == "done"
    )
    assert of_event(events, "tool.result")[0]["outcome"] == "ok" and len(sending.runs) == 1
    # Allowed once: the chat does not allow it from now on.
    assert (await Conversation.objects.aget(id=accepted["conversation"])).tools_allowed == []
    # Answered, the call no longer waits: a second answer changes nothing.
    response = await client_post(chat_server, await key_for(alice), approval_url(accepted["conversation"]), answer)
    assert response.status_code == 409 and response.json()["error"]["code"] == "not_waiting"


async def client_post(server: str, key: str, url: str, body) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        return await client.post(url, json=body)


async def test_a_call_refused_through_the_endpoint_is_told_to_the_model_and_never_runs(
    chat_server, alice, granted_tools
):
    sending = await granted_tools(Sending())
    async with asking_first(chat_server, alice) as (stream, client, accepted, approval):
        answer = {"generation": approval["generation"], "call": approval["call"]["id"], "decision": "deny"}
        assert (await client.post(approval_url(accepted["conversation"]), json=answer)).status_code == 200
        events = await stream.rest()
    assert of_event(events, "tool.result")[0]["outcome"] == "refused" and sending.runs == []
    assert not of_event(events, "tool.running") and events[-1][0] == "done"
    assert "did not allow" in (await Message.objects.aget(role="tool")).content


async def test_another_users_answer_and_bad_answers_are_refused_and_change_nothing(
    chat_server, alice, mallory, granted_tools
):
    sending = await granted_tools(Sending())
    mallory_key = await key_for(mallory)
    theirs = await database_sync_to_async(lambda: conversation_create(user=mallory, title="Mine").id)()
    async with asking_first(chat_server, alice) as (stream, client, accepted, approval):
        url = approval_url(accepted["conversation"])
        answer = {"generation": approval["generation"], "call": approval["call"]["id"], "decision": "once"}
        # Another user: not found, through alice's conversation or their own.
        for their_url in (url, approval_url(theirs)):
            response = await client_post(chat_server, mallory_key, their_url, answer)
            assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
        refused = [
            ({**answer, "decision": "always"}, 400, "decision"),
            ({**answer, "decision": None}, 400, "decision"),
            ({key: v for key, v in answer.items() if key != "call"}, 400, "call"),
            ({**answer, "call": 12}, 400, "call"),
            ({**answer, "call": "x" * 129}, 400, "call"),
            ({**answer, "generation": "not-a-uuid"}, 400, "generation"),
            ({**answer, "extra": 1}, 400, "extra"),
            ({**answer, "call": "call_of_nothing"}, 409, "call"),
            ({**answer, "generation": str(uuid.uuid4())}, 404, "generation"),
        ]
        for body, status, param in refused:
            response = await client.post(url, json=body)
            assert (response.status_code, response.json()["error"]["param"]) == (status, param), body
        for raw in (b"[1]", b"{not json", b""):
            response = await client.post(url, content=raw, headers={"Content-Type": "application/json"})
            assert response.status_code == 400, raw
        assert (await client.get(url)).status_code == 405
        async with httpx.AsyncClient(base_url=chat_server, timeout=30) as anonymous:
            assert (await anonymous.post(url, json=answer)).status_code == 401
        # Still waiting, nothing run: the owner's answer is the one taken.
        assert sending.runs == []
        assert (await client.post(url, json={**answer, "decision": "chat"})).status_code == 200
        events = await stream.rest()
    assert of_event(events, "tool.result")[0]["outcome"] == "ok" and len(sending.runs) == 1
    assert (await Conversation.objects.aget(id=accepted["conversation"])).tools_allowed == ["send_note"]


@pytest.mark.topology
async def test_stop_during_a_tool_call_ends_the_answer_there(chat_server, alice, granted_tools):
    hanging = await granted_tools(Hanging())
    async with streaming(chat_server, await key_for(alice), {"content": "[call hanging] x", "tools": True}) as (
        stream,
        client,
    ):
        accepted = await stream.until("message.accepted")
        running = await stream.until("tool.running")
        response = await client.post(stop_url(accepted["conversation"]), json={"generation": running["generation"]})
        assert response.status_code == 200 and response.json()["stopped"] is True
        events = await stream.rest()
    assert events[-1] == ("tool.stopped", {"generation": running["generation"]}) and hanging.cancelled
    step = await Message.objects.aget(role="assistant")
    assert step.status == "stopped" and not await Message.objects.filter(role="tool").aexists()
    # Over: a second Stop has nothing to stop.
    response = await client_post(
        chat_server, await key_for(alice), stop_url(accepted["conversation"]), {"generation": running["generation"]}
    )
    assert response.status_code == 409 and response.json()["error"]["code"] == "not_running"


async def test_stop_while_a_step_is_written_ends_it_as_an_answer(chat_server, alice):
    async with streaming(chat_server, await key_for(alice), {"content": "Write a very long story. [write on]"}) as (
        stream,
        client,
    ):
        accepted = await stream.until("message.accepted")
        await stream.until("delta")
        response = await client.post(stop_url(accepted["conversation"]), json={"generation": accepted["generation"]})
        assert response.status_code == 200
        events = await stream.rest()
    assert events[-1][0] == "done" and events[-1][1]["status"] == "stopped"


async def test_a_client_that_leaves_during_a_tool_call_ends_the_loop(chat_server, alice, granted_tools):
    hanging = await granted_tools(Hanging())
    async with streaming(chat_server, await key_for(alice), {"content": "[call hanging] x", "tools": True}) as (
        stream,
        _,
    ):
        await stream.until("tool.running")
    step = await step_once_stopped()
    assert step.status == "stopped" and hanging.cancelled
    assert not await Message.objects.filter(role="tool").aexists()


async def step_once_stopped() -> Message:
    """The answer's (only) step once it is marked stopped, or as it stands after 10 s: a loop whose
    client left ends a moment after the response does."""
    for _ in range(100):
        step = await Message.objects.aget(role="assistant")
        if step.status == "stopped":
            break
        await asyncio.sleep(0.1)
    return step


@override_settings(TOOLS_APPROVAL_TIMEOUT_S=0.3)
async def test_a_call_nobody_answers_in_time_is_refused(chat_server, alice, granted_tools):
    sending = await granted_tools(Sending())
    async with asking_first(chat_server, alice) as (stream, client, accepted, approval):
        events = await stream.rest()
        answer = {"generation": approval["generation"], "call": approval["call"]["id"], "decision": "once"}
        response = await client.post(approval_url(accepted["conversation"]), json=answer)
    assert of_event(events, "tool.result")[0]["outcome"] == "refused" and sending.runs == []
    assert events[-1][0] == "done" and response.status_code == 409


async def test_a_question_waiting_for_its_answer_keeps_the_stream_alive(
    chat_server, alice, granted_tools, monkeypatch, settings
):
    """A proxy that closes a response quiet for longer than it allows must not end an answer while
    the person decides: the stream says a comment line, which clients skip, while it waits."""
    monkeypatch.setattr(tool_streams, "KEEPALIVE_S", 0.2)
    settings.INFERENCE_STREAM_RESYNC_S = 0.1
    await granted_tools(Sending())
    async with asking_first(chat_server, alice) as (stream, client, accepted, approval):
        raw = await asyncio.wait_for(anext(stream.lines), 5)
        while raw == "":
            raw = await asyncio.wait_for(anext(stream.lines), 5)
        assert raw == ": keep-alive"
        answer = {"generation": approval["generation"], "call": approval["call"]["id"], "decision": "deny"}
        assert (await client.post(approval_url(accepted["conversation"]), json=answer)).status_code == 200
        events = await stream.rest()
    assert of_event(events, "tool.result")[0]["outcome"] == "refused" and events[-1][0] == "done"


def test_the_endpoints_need_the_chat_scope_or_a_session_with_its_csrf_token(alice):
    conversation = conversation_create(user=alice, title="Plans")
    body = {"generation": str(uuid.uuid4()), "call": "c", "decision": "once"}
    without_chat = APIClient()
    key = api_key_create(user=alice, name="read", scopes=["conversations:read"]).key
    without_chat.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    session = APIClient(enforce_csrf_checks=True)
    session.force_login(alice)
    for url, sent in (
        (approval_url(conversation.id), body),
        (stop_url(conversation.id), {"generation": body["generation"]}),
    ):
        response = without_chat.post(url, sent, format="json")
        assert response.status_code == 403 and response.json()["error"]["code"] == "insufficient_scope"
        response = session.post(url, sent, format="json")
        assert response.status_code == 403 and response.json()["error"]["code"] == "csrf_failed"
        session.cookies["csrftoken"] = TOKEN
        response = session.post(url, sent, format="json", HTTP_X_CSRFTOKEN=TOKEN)
        assert response.status_code == 404 and response.json()["error"]["param"] == "generation"


async def test_a_server_restart_during_a_tool_call_ends_the_stream_and_the_loop(
    chat_server, alice, granted_tools, monkeypatch
):
    # This test's restart leaves the next test's streams alone.
    monkeypatch.setattr(streams, "_restart_requested", False)
    monkeypatch.setattr(streams, "_restart_events", weakref.WeakKeyDictionary())
    hanging = await granted_tools(Hanging())
    async with streaming(chat_server, await key_for(alice), {"content": "[call hanging] x", "tools": True}) as (
        stream,
        _,
    ):
        running = await stream.until("tool.running")
        streams.streams_end_for_restart()
        events = await stream.rest()
    assert events[-1][0] == "error" and events[-1][1]["code"] == "server_restarting"
    assert events[-1][1]["generation"] == running["generation"]
    step = await step_once_stopped()
    assert step.status == "stopped" and hanging.cancelled
