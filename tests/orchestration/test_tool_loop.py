"""The tool loop end to end through the chat socket, on the scripted engine: in the embedded run and
(marked `topology`) with the answers written by a real Celery worker. The scripted engine calls a
tool when the newest user turn says `[call <name>]` or the request forces a call; a tool's result
comes back to it as a user turn, which it quotes."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from django.test import override_settings

from billing.models import UsageRecord
from conversations.models import Message
from tests.helpers.sockets import next_event, open_socket
from tests.orchestration.tools import Echo, Failing, Hanging, Sending

pytestmark = pytest.mark.django_db(transaction=True)

STEP_FRAMES = ("tool.calls", "tool.approval", "tool.running", "tool.result", "tool.step", "tool.stopped")


async def until_done(socket, *, timeout: float = 60) -> list[dict]:
    """Every frame of an answer until its last step's end."""
    events = []
    while True:
        event = await next_event(socket, timeout=timeout)
        events.append(event)
        if event["type"] in ("generation.done", "generation.error", "error"):
            return events


def of_type(events, kind):
    return [e for e in events if e["type"] == kind]


def text_of(events) -> str:
    return "".join(e["text"] for e in of_type(events, "generation.delta"))


async def branch_of(conversation_id):
    return [m async for m in Message.objects.filter(conversation_id=conversation_id).order_by("id")]


@pytest.mark.topology
async def test_a_tool_call_runs_and_the_model_answers_with_its_result(engine, alice, granted_tools):
    echo = await granted_tools(Echo())
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "[call echo] what is new?", "tools": True})
    events = await until_done(socket)
    accepted = of_type(events, "message.accepted")[0]
    assert "echo" in accepted["tools"]["names"] and accepted["tools"]["forced"] is None
    calls = of_type(events, "tool.calls")[0]
    assert [c["name"] for c in calls["calls"]] == ["echo"]
    result = of_type(events, "tool.result")[0]
    assert result["outcome"] == "ok" and result["output"] == "The echo heard: scripted"
    step = of_type(events, "tool.step")[0]
    assert step["step"] == 2 and step["assistant_message"]["parent"] == result["message"]
    done = events[-1]
    assert done["type"] == "generation.done" and done["generation"] == step["generation"]
    # The call's text never reaches the page; the answer in words quotes the tool's turn.
    shown = text_of(events)
    assert "<tool_call>" not in shown and "tool_response" in shown and "The result of the tool echo" in shown
    assert echo.runs == [{"text": "scripted"}]

    user, first, tool, final = await branch_of(accepted["conversation"])
    assert (user.role, first.role, tool.role, final.role) == ("user", "assistant", "tool", "assistant")
    assert first.parent_id == user.id and tool.parent_id == first.id and final.parent_id == tool.id
    assert first.tool_calls[0]["function"]["name"] == "echo" and first.finish_reason == "tool_calls"
    assert tool.tool_call_id == first.tool_calls[0]["id"] and tool.tool_shown["outcome"] == "ok"
    assert "<<<quote" in tool.content and "| The echo heard: scripted" in tool.content
    assert final.status == "complete" and final.content.startswith('You said "')
    # Each model call is billed; both steps are on the ledger.
    billed = [r async for r in UsageRecord.objects.filter(kind="generation").order_by("created_at")]
    assert {str(r.generation_id) for r in billed} == {accepted["generation"], step["generation"]}
    await socket.disconnect()
