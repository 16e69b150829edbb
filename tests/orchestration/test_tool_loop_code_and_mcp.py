"""The code sandbox's and the MCP servers' tools run through the tool loop end to end on the chat socket:
asked for by name, approved where they have side effects, their results screened and fenced, and the
answer written after them (the tools' own behaviour: test_run_code.py, test_mcp.py)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from accounts.models import Tier
from conversations.models import Message
from orchestration.models import McpServer
from orchestration.tools.mcp import mcp_cache_clear
from orchestration.tools.run_code import run_code_available
from tests.helpers.servers import mcp_server_serving
from tests.helpers.sockets import next_event, open_socket

pytestmark = pytest.mark.django_db(transaction=True)


async def until_done(socket, *, approve: str | None = None, timeout: float = 60) -> list[dict]:
    events = []
    while True:
        event = await next_event(socket, timeout=timeout)
        events.append(event)
        if event["type"] == "tool.approval" and approve is not None:
            await socket.send_json_to(
                {
                    "type": "tool.approve",
                    "generation": event["generation"],
                    "call": event["call"]["id"],
                    "decision": approve,
                }
            )
        if event["type"] in ("generation.done", "generation.error", "error"):
            return events


@pytest.mark.skipif(not run_code_available(), reason="the sandbox cannot run on this machine (bubblewrap)")
@pytest.mark.topology
async def test_code_asked_for_with_run_is_approved_run_in_the_sandbox_and_answered(engine, alice, granted_tools):
    await granted_tools("run_code")
    socket, _ = await open_socket(alice)
    # The scripted engine's call is a value of the tool's schema: the program `scripted`, a NameError.
    await socket.send_json_to({"type": "message.send", "content": "print(6 * 7)", "tool": "run_code"})
    events = await until_done(socket, approve="once")
    assert [e["call"]["name"] for e in events if e["type"] == "tool.approval"] == ["run_code"]
    result = next(e for e in events if e["type"] == "tool.result")
    assert result["name"] == "run_code" and "NameError" in result["output"]
    assert events[-1]["type"] == "generation.done"
    tool = await Message.objects.aget(role="tool")
    assert tool.tool_name == "run_code" and "<<<quote" in tool.content
    await socket.disconnect()


@pytest.mark.skipif(not run_code_available(), reason="the sandbox cannot run on this machine (bubblewrap)")
async def test_code_refused_never_runs(engine, alice, granted_tools):
    await granted_tools("run_code")
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "print(1)", "tool": "run_code"})
    events = await until_done(socket, approve="deny")
    result = next(e for e in events if e["type"] == "tool.result")
    assert result["outcome"] == "refused" and events[-1]["type"] == "generation.done"
    await socket.disconnect()


@pytest.fixture
def mcp_url():
    with mcp_server_serving() as url:
        mcp_cache_clear()
        yield url
        mcp_cache_clear()


@database_sync_to_async
def mcp_server_for_free_plan(url: str) -> None:
    server = McpServer.objects.create(name="search", transport=McpServer.Transport.HTTP, url=url)
    server.tiers.set([Tier.objects.get(name="free")])


@pytest.mark.topology
async def test_an_mcp_servers_tool_runs_through_the_loop_for_the_plan_it_was_added_for(engine, alice, mcp_url):
    await mcp_server_for_free_plan(mcp_url)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "add one and one", "tool": "search__add"})
    events = await until_done(socket)
    result = next(e for e in events if e["type"] == "tool.result")
    assert (result["name"], result["outcome"], result["output"]) == ("search__add", "ok", "2")
    assert events[-1]["type"] == "generation.done"
    await socket.disconnect()


async def test_an_mcp_tool_with_side_effects_asks_first(engine, alice, mcp_url):
    await mcp_server_for_free_plan(mcp_url)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "keep a note", "tool": "search__note"})
    events = await until_done(socket, approve="once")
    assert [e["call"]["name"] for e in events if e["type"] == "tool.approval"] == ["search__note"]
    result = next(e for e in events if e["type"] == "tool.result")
    assert result["outcome"] == "ok" and result["output"] == "kept: scripted"
    await socket.disconnect()


async def test_an_mcp_server_is_not_offered_to_a_plan_it_was_not_added_for(engine, bob, mcp_url):
    await mcp_server_for_free_plan(mcp_url)
    pro = await Tier.objects.aget(name="pro")
    await type(bob).objects.filter(id=bob.id).aupdate(tier=pro)
    socket, _ = await open_socket(bob)
    await socket.send_json_to({"type": "message.send", "content": "add", "tool": "search__add"})
    reply = await next_event(socket, timeout=30)
    assert (reply["type"], reply["code"]) == ("error", "tool_unavailable")
    await socket.disconnect()
