"""An answer's tool loop in the person's other sockets (other tabs, a page that reconnected): they read
its steps with the deployment's tool parser, so only words reach them, and hear the driving socket's
calls, results and steps; only the socket that asked answers a question. Another user hears nothing.
On the scripted engine, whose step that calls a tool is nothing but the call's text."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from conversations.models import Message
from tests.helpers.sockets import ENGINE_STATUS, events_but_broadcasts, next_event, open_socket
from tests.orchestration.tools import Echo, Sending

pytestmark = [pytest.mark.topology, pytest.mark.django_db(transaction=True)]

OTHERS = ("engine.status", "conversation.title", "conversation.summary")
RAW = ("<tool_call>", '"name": "echo"', '"arguments"')


async def as_a_page(socket, *, until: str = "generation.done") -> list[dict]:
    """Every frame another tab hears of an answer, following its streams as the page does: from the
    start on hearing of the message, and each next step the driving tab announces."""
    events = []
    while True:
        event = await next_event(socket, skipping=OTHERS)
        events.append(event)
        if event["type"] == "conversation.message":
            await socket.send_json_to({"type": "generation.resume", "generation": event["generation"], "after_seq": 0})
        elif event["type"] == "tool.step":
            await socket.send_json_to({"type": "generation.resume", "generation": event["generation"], "after_seq": 0})
        if event["type"] in (until, "generation.error", "error"):
            return events


def of_type(events, kind):
    return [e for e in events if e["type"] == kind]


def words(events) -> str:
    return "".join(e["text"] for e in of_type(events, "generation.delta"))


async def test_another_tab_follows_the_loop_with_its_calls_results_and_steps_and_no_call_text(
    engine, alice, bob, granted_tools
):
    echo = await granted_tools(Echo())
    sender, _ = await open_socket(alice)
    other_tab, _ = await open_socket(alice)
    bobs, _ = await open_socket(bob)
    await sender.send_json_to({"type": "message.send", "content": "[call echo] what is new?", "tools": True})
    asked = []
    while not asked or asked[-1]["type"] != "generation.done":
        asked.append(await next_event(sender, skipping=OTHERS))

    seen = await as_a_page(other_tab)
    told = of_type(seen, "conversation.message")[0]
    assert told["generation"] == of_type(asked, "message.accepted")[0]["generation"]
    # The same calls, results and steps as the tab that asked, each marked as driven elsewhere.
    calls = of_type(seen, "tool.calls")
    assert len(calls) == 1 and calls[0]["elsewhere"] is True
    assert calls[0]["calls"] == of_type(asked, "tool.calls")[0]["calls"]
    result = of_type(seen, "tool.result")[0]
    assert result["outcome"] == "ok" and result["output"] == "The echo heard: scripted" and result["elsewhere"]
    assert [e["type"] for e in seen if e["type"].startswith("tool.")] == [
        "tool.calls",
        "tool.running",
        "tool.result",
        "tool.step",
    ]
    step = of_type(seen, "tool.step")[0]
    assert step["generation"] == of_type(asked, "tool.step")[0]["generation"]
    # The answer in words, as the tab that asked streamed it; no text of the call anywhere.
    done = seen[-1]
    assert done["type"] == "generation.done" and done["generation"] == step["generation"]
    assert words(seen) == words(asked) and words(seen).startswith("You said")
    assert not any(raw in words(seen) for raw in RAW)
    assert len(echo.runs) == 1  # run once, by the tab that asked

    assert (
        await events_but_broadcasts(bobs, timeout=0.5, skipping=ENGINE_STATUS) == []
    )  # another user hears nothing of it
    for socket in (sender, other_tab, bobs):
        await socket.disconnect()


async def test_a_question_is_shown_in_the_other_tab_but_answered_only_where_it_was_asked(engine, alice, granted_tools):
    sending = await granted_tools(Sending())
    sender, _ = await open_socket(alice)
    other_tab, _ = await open_socket(alice)
    await sender.send_json_to({"type": "message.send", "content": "[call send_note] x", "tools": True})
    approval = await next_event(sender, skipping=OTHERS)
    while approval["type"] != "tool.approval":
        approval = await next_event(sender, skipping=OTHERS)

    seen = await as_a_page(other_tab, until="tool.approval")
    shown = seen[-1]
    assert shown["elsewhere"] is True and shown["call"] == approval["call"]
    answer = {"type": "tool.approve", "generation": approval["generation"], "call": approval["call"]["id"]}
    await other_tab.send_json_to({**answer, "decision": "once"})
    refused = await next_event(other_tab, skipping=OTHERS)
    assert (refused["type"], refused["code"]) == ("error", "invalid_request") and sending.runs == []

    await sender.send_json_to({**answer, "decision": "deny"})
    seen = await as_a_page(other_tab)
    assert of_type(seen, "tool.result")[0]["outcome"] == "refused" and sending.runs == []
    assert seen[-1]["type"] == "generation.done"
    for socket in (sender, other_tab):
        await socket.disconnect()


async def test_a_step_resumed_after_the_tab_that_drove_it_closed_shows_its_calls_and_ends(engine, alice, granted_tools):
    echo = await granted_tools(Echo())
    sender, _ = await open_socket(alice)
    await sender.send_json_to({"type": "message.send", "content": "[call echo] x", "tools": True})
    accepted = await next_event(sender, skipping=(*OTHERS, "conversation.created"))
    assert accepted["type"] == "message.accepted"
    await sender.disconnect()  # the page lost its socket mid-step: the loop ends with it

    # Its next socket resumes the step from where the page was (three events in).
    again, _ = await open_socket(alice)
    await again.send_json_to({"type": "generation.resume", "generation": accepted["generation"], "after_seq": 3})
    seen = await as_a_page(again, until="tool.ended")
    assert all(e["seq"] > 3 for e in of_type(seen, "generation.delta"))
    assert not any(raw in words(seen) for raw in RAW)
    calls = of_type(seen, "tool.calls")
    assert len(calls) == 1 and [c["name"] for c in calls[0]["calls"]] == ["echo"]
    assert calls[0]["calls"][0]["arguments"] == '{"text": "scripted"}'
    assert "tab that asked for them" in seen[-1]["note"] and seen[-1]["generation"] == accepted["generation"]
    assert not of_type(seen, "generation.done") and len(echo.runs) <= 1
    await again.disconnect()


async def test_a_tab_following_a_step_whose_driver_closes_shows_its_calls_and_that_the_loop_ended(
    engine, alice, granted_tools
):
    await granted_tools(Echo())
    sender, _ = await open_socket(alice)
    other_tab, _ = await open_socket(alice)
    await sender.send_json_to({"type": "message.send", "content": "[call echo] x", "tools": True})
    told = await next_event(other_tab, skipping=OTHERS)
    assert told["type"] == "conversation.message"
    await other_tab.send_json_to({"type": "generation.resume", "generation": told["generation"], "after_seq": 0})
    await sender.disconnect()  # while the other tab follows the step: the loop ends with its socket

    seen = await as_a_page(other_tab, until="tool.ended")
    assert not any(raw in words(seen) for raw in RAW) and not of_type(seen, "generation.done")
    assert [e["type"] for e in seen if e["type"].startswith("tool.")][-1] == "tool.ended"
    assert [c["name"] for c in of_type(seen, "tool.calls")[0]["calls"]] == ["echo"]
    await other_tab.disconnect()


async def test_a_step_whose_driver_closed_before_reading_it_shows_its_calls_as_not_run_after_a_reload(
    engine, alice, granted_tools
):
    echo = await granted_tools(Echo())
    sender, _ = await open_socket(alice)
    await sender.send_json_to({"type": "message.send", "content": "[call echo] x", "tools": True})
    accepted = await next_event(sender, skipping=(*OTHERS, "conversation.created"))
    await sender.disconnect()  # before the step ended: nobody read its calls, and its row keeps their text

    answer = await answer_when_ended(accepted["assistant_message"]["id"])
    assert not answer.tool_calls and '"name": "echo"' in answer.content and echo.runs == []
    page = await sync_to_async(chat_page_of)(alice, accepted["conversation"])
    assert not any(raw in page for raw in RAW)
    assert "Used echo (not run)" in page and "tab that asked for them" in page


async def answer_when_ended(message_id: int) -> Message:
    for _ in range(200):
        answer = await Message.objects.aget(id=message_id)
        if not answer.is_in_progress:
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError("the step never ended")


def chat_page_of(user, conversation_id: int) -> str:
    client = Client()
    client.force_login(user)
    return client.get(f"/c/{conversation_id}/").content.decode()
