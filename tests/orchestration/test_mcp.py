"""MCP servers' tools: listed, called and bounded against a real server on the official SDK
(tests/helpers/mcp_server.py), over Streamable HTTP on loopback and over stdio, only for the tiers
the operator chose; and the admin form that adds a server."""

from __future__ import annotations

import sys
import time

import psutil
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Permission
from django.urls import reverse

from accounts.models import Tier
from orchestration.models import McpServer
from orchestration.tools.base import ToolContext, ToolSpec
from orchestration.tools.mcp import (
    SHUTDOWN_GRACE_S,
    McpEndpoint,
    McpTool,
    mcp_cache_clear,
    mcp_tool_source,
    mcp_tools_for,
)
from tests.helpers.servers import free_port, mcp_server_serving

pytestmark = pytest.mark.django_db


def context(timeout_s: float = 20) -> ToolContext:
    return ToolContext(user_id=1, conversation_id=None, timeout_s=timeout_s, max_output_chars=4000)


@pytest.fixture(scope="module")
def mcp_url():
    """The test server over Streamable HTTP, in a process of its own, once it accepts connections."""
    with mcp_server_serving() as url:
        yield url


@pytest.fixture(autouse=True)
def fresh_lists():
    mcp_cache_clear()
    yield
    mcp_cache_clear()


@pytest.fixture
def free_tier():
    return Tier.objects.get(name="free")


def http_server(url: str, *tiers: Tier, name: str = "search", **fields) -> McpServer:
    server = McpServer.objects.create(name=name, transport=McpServer.Transport.HTTP, url=url, **fields)
    server.tiers.set(tiers)
    return server


def stdio_server(*tiers: Tier, name: str = "local") -> McpServer:
    server = McpServer.objects.create(
        name=name,
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-m", "tests.helpers.mcp_server", "stdio"],
    )
    server.tiers.set(tiers)
    return server


def tools_for(tier: Tier | None) -> dict[str, McpTool]:
    return {tool.spec.name: tool for tool in async_to_sync(mcp_tools_for)(tier=tier)}


def call(tool: McpTool, arguments: dict, *, timeout_s: float = 20):
    return async_to_sync(tool.run)(arguments=arguments, context=context(timeout_s))


def test_a_servers_tools_are_listed_under_its_name_with_their_schemas(mcp_url, free_tier):
    http_server(mcp_url, free_tier)
    tools = tools_for(free_tier)
    assert set(tools) == {
        "search__add",
        "search__note",
        "search__broken",
        "search__crash",
        "search__hang",
        "search__environment",
    }
    # Left out: "sprawling", whose schema is too long to carry in every prompt.
    add = tools["search__add"].spec
    assert add.description == "Add two whole numbers."
    assert add.parameters["type"] == "object" and set(add.parameters["properties"]) == {"a", "b"}
    # Read-only only where the server says so.
    assert add.side_effects is False
    assert tools["search__note"].spec.side_effects is True


def test_calling_a_tool_returns_its_answer_as_text(mcp_url, free_tier):
    http_server(mcp_url, free_tier)
    tools = tools_for(free_tier)
    result = call(tools["search__add"], {"a": 2, "b": 3})
    assert not result.failed and result.content == "5"
    assert call(tools["search__note"], {"text": "milk"}).content == "kept: milk"


def test_a_tools_error_is_a_failed_result(mcp_url, free_tier):
    http_server(mcp_url, free_tier)
    tools = tools_for(free_tier)
    result = call(tools["search__broken"], {})
    assert result.failed
    assert "broken on purpose" in result.content
    crashed = call(tools["search__crash"], {})
    assert crashed.failed and "Error executing tool crash" in crashed.content
    assert "internal detail" not in crashed.content


def test_a_hanging_tool_is_stopped_at_the_servers_timeout(mcp_url, free_tier):
    http_server(mcp_url, free_tier, timeout_s=1.5)
    hang = tools_for(free_tier)["search__hang"]
    started = time.monotonic()
    result = call(hang, {})
    assert time.monotonic() - started < 10
    assert result.failed and "did not answer within 1.5 s" in result.content


def test_the_turns_own_timeout_bounds_a_call_too(mcp_url, free_tier):
    http_server(mcp_url, free_tier)
    started = time.monotonic()
    result = call(tools_for(free_tier)["search__hang"], {}, timeout_s=1)
    assert time.monotonic() - started < 10
    assert result.failed and "within 1 s" in result.content


def test_a_server_that_is_down_is_left_out_and_its_calls_fail(mcp_url, free_tier):
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    http_server(dead, free_tier, name="down", timeout_s=3)
    http_server(mcp_url, free_tier)
    assert {name.split("__")[0] for name in tools_for(free_tier)} == {"search"}
    endpoint = McpEndpoint.from_row(McpServer.objects.get(name="down"))
    orphan = McpTool(
        spec=ToolSpec(name="down__add", description="", parameters={}), endpoint=endpoint, remote_name="add"
    )
    result = call(orphan, {"a": 1, "b": 1})
    assert result.failed and "could not be reached" in result.content


@pytest.mark.topology
def test_only_the_chosen_tiers_get_an_enabled_servers_tools(mcp_url, free_tier):
    pro = Tier.objects.get(name="pro")
    server = http_server(mcp_url, pro)
    assert tools_for(free_tier) == {}
    assert "search__add" in tools_for(pro)
    assert tools_for(None) == {}
    server.enabled = False
    server.save()
    assert tools_for(pro) == {}


def test_the_synchronous_source_gives_the_same_tools_from_a_database_thread(mcp_url, free_tier):
    """As a tool registry calls it: in a thread of the event loop's, via sync_to_async."""
    http_server(mcp_url, free_tier)

    async def from_the_loop():
        return await sync_to_async(mcp_tool_source)(free_tier.id)

    tools = {tool.spec.name: tool for tool in async_to_sync(from_the_loop)()}
    assert "search__add" in tools
    assert call(tools["search__add"], {"a": 1, "b": 1}).content == "2"
    # Kept: the second time asks no server.
    assert [tool.spec.name for tool in mcp_tool_source(free_tier.id)] == list(tools)
    assert mcp_tool_source(None) == []


def test_the_list_is_kept_for_a_while_and_asked_again_when_the_server_changes(mcp_url, free_tier):
    server = http_server(mcp_url, free_tier)
    assert "search__add" in tools_for(free_tier)
    # Moved away without a save: the kept list still serves.
    McpServer.objects.filter(id=server.id).update(url=f"http://127.0.0.1:{free_port()}/mcp", timeout_s=2)
    assert "search__add" in tools_for(free_tier)
    server.refresh_from_db()
    server.save()
    assert tools_for(free_tier) == {}


def test_a_credential_missing_from_the_environment_fails_the_call(mcp_url, free_tier, monkeypatch):
    monkeypatch.delenv("MCP_TEST_TOKEN", raising=False)
    server = http_server(mcp_url, free_tier, auth_env_var="MCP_TEST_TOKEN")
    assert tools_for(free_tier) == {}
    monkeypatch.setenv("MCP_TEST_TOKEN", "Bearer test")
    server.save()
    add = tools_for(free_tier)["search__add"]
    monkeypatch.delenv("MCP_TEST_TOKEN")
    result = call(add, {"a": 1, "b": 2})
    assert result.failed and "not configured" in result.content


def test_a_stdio_server_is_listed_and_called_without_the_services_environment(free_tier, monkeypatch):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-service-secret-key")
    stdio_server(free_tier)
    tools = tools_for(free_tier)
    assert "local__add" in tools
    assert call(tools["local__add"], {"a": 40, "b": 2}).content == "42"
    leaked = call(tools["local__environment"], {"name": "DJANGO_SECRET_KEY"})
    assert not leaked.failed and leaked.content == "[]"


def test_a_hanging_stdio_tool_is_stopped_and_its_process_ends(free_tier):
    stdio_server(free_tier)
    hang = tools_for(free_tier)["local__hang"]
    started = time.monotonic()
    result = call(hang, {}, timeout_s=4)
    # Its answer waited for 4 s; ending its process takes a few more (the SDK's grace, then signals).
    assert time.monotonic() - started < 4 + SHUTDOWN_GRACE_S
    assert result.failed and "did not answer" in result.content
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        running = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.cmdline()[-2:] == ["tests.helpers.mcp_server", "stdio"]
        ]
        if not running:
            break
        time.sleep(0.1)
    assert not running


# --- the admin -------------------------------------------------------------------------------------


def add_form(**fields) -> dict:
    data = {
        "name": "search",
        "enabled": "on",
        "timeout_s": "30",
        "transport": "http",
        "url": "https://mcp.example.com/mcp",
        "auth_header": "Authorization",
        "auth_env_var": "MCP_SEARCH_TOKEN",
        "command": "",
        "args": "[]",
    }
    data.update(fields)
    return data


@pytest.mark.topology
def test_an_operator_adds_a_server_in_the_admin(admin_client, free_tier):
    url = reverse("admin:orchestration_mcpserver_add")
    assert admin_client.get(url).status_code == 200
    response = admin_client.post(url, add_form(tiers=[str(free_tier.id)]))
    assert response.status_code == 302, response.context["adminform"].form.errors
    server = McpServer.objects.get(name="search")
    assert server.url == "https://mcp.example.com/mcp" and list(server.tiers.all()) == [free_tier]
    assert server.auth_env_var == "MCP_SEARCH_TOKEN"


def test_the_admin_refuses_a_server_that_does_not_hold_together(admin_client):
    url = reverse("admin:orchestration_mcpserver_add")
    for fields in (
        {"url": ""},
        {"url": "ftp://mcp.example.com/"},
        {"name": "has space"},
        {"auth_env_var": "not-a-name"},
        {"transport": "stdio"},
        {"transport": "stdio", "url": "", "command": "/usr/bin/x", "args": '"-m"'},
    ):
        response = admin_client.post(url, add_form(**fields))
        assert response.status_code == 200, fields
        assert response.context["adminform"].form.errors, fields
    assert not McpServer.objects.exists()


def test_only_a_superuser_may_add_a_stdio_server(client, make_user):
    staff = make_user("operator")
    staff.is_staff = True
    staff.save()
    staff.user_permissions.set(Permission.objects.filter(codename__in=["add_mcpserver", "view_mcpserver"]))
    client.force_login(staff)
    url = reverse("admin:orchestration_mcpserver_add")
    stdio = add_form(transport="stdio", url="", command="/bin/sh", args='["-c", "id"]')
    response = client.post(url, stdio)
    assert response.status_code == 200
    assert "Only a superuser" in str(response.context["adminform"].form.errors)
    assert not McpServer.objects.exists()
    assert client.post(url, add_form()).status_code == 302
