"""Tools from the Model Context Protocol servers an operator adds (orchestration.models.McpServer),
through the official MCP SDK's client.

`mcp_tools_for(tier=...)` (and `mcp_tool_source(tier_id)`, the same for synchronous callers) gives
the tools of every enabled server the tier may use, each a `Tool`
named `<server>__<tool>` (so two servers' tools never clash), with the server's description and
input schema, and `side_effects` unless the server marks the tool read-only (its `readOnlyHint`).
A server's list is kept MCP_TOOLS_CACHE_S seconds, and again whenever the server's row changes; a
server that cannot be listed is left out (and logged), not the others with it.

Each call opens its own connection (a stdio server's process lives for the call) and waits for its
answer the lower of the server's timeout and the turn's (then a few seconds for a stdio server's
process to end): no session outlives the event loop that opened
it, in a web process or a worker. What a server answers is untrusted text, like any tool's; its
errors come back as failed results, never as exceptions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from asgiref.sync import async_to_sync
from django.conf import settings
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import REQUEST_TIMEOUT

from accounts.models import Tier
from orchestration.models import McpServer
from orchestration.tools.base import ToolContext, ToolResult, ToolSpec, result_clipped

logger = logging.getLogger(__name__)

MAX_DESCRIPTION_CHARS = 1024
MAX_SCHEMA_CHARS = 8192
# How long past a call's own timeout its connection may take to close: the SDK gives a stdio server
# 2 s to exit once its input is closed, then 2 s after SIGTERM, then kills it and waits 2 s to reap
# it. Generous, since cutting that short is what could leave the process behind.
SHUTDOWN_GRACE_S = 15.0
NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class McpEndpoint:
    """What a call needs of a server's row, read once so that no call touches the database."""

    id: int
    name: str
    transport: str
    url: str
    auth_header: str
    auth_env_var: str
    command: str
    args: tuple[str, ...]
    timeout_s: float

    @classmethod
    def from_row(cls, row: McpServer) -> McpEndpoint:
        return cls(
            id=row.id,
            name=row.name,
            transport=row.transport,
            url=row.url,
            auth_header=row.auth_header or "Authorization",
            auth_env_var=row.auth_env_var,
            command=row.command,
            args=tuple(row.args or ()),
            timeout_s=row.timeout_s,
        )


class McpUnavailable(Exception):
    """The server cannot be asked (its credential is not in the environment)."""


@dataclass(frozen=True)
class McpTool:
    spec: ToolSpec
    endpoint: McpEndpoint
    remote_name: str

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        timeout_s = max(0.1, min(context.timeout_s, self.endpoint.timeout_s))
        deadline = time.monotonic() + timeout_s
        late = f"The tool server {self.endpoint.name} did not answer within {timeout_s:g} s."
        try:
            # The SDK's own request timeouts end a call cleanly (a stdio server's process stopped
            # and reaped); the outer bound is a backstop that leaves that shutdown its time.
            async with asyncio.timeout(timeout_s + SHUTDOWN_GRACE_S):
                async with mcp_client(self.endpoint, timeout_s=timeout_s) as client:
                    result = await client.call_tool(
                        self.remote_name, dict(arguments), read_timeout_seconds=max(0.1, deadline - time.monotonic())
                    )
        except TimeoutError:
            return ToolResult(content=late, failed=True)
        except McpUnavailable as error:
            logger.warning("MCP server %s: %s", self.endpoint.name, error)
            return ToolResult(content=f"The tool server {self.endpoint.name} is not configured.", failed=True)
        except Exception as error:
            if _timed_out(error):
                return ToolResult(content=late, failed=True)
            logger.warning("MCP server %s: %s failed: %r", self.endpoint.name, self.remote_name, error)
            return ToolResult(content=f"The tool server {self.endpoint.name} could not be reached.", failed=True)
        return result_clipped(
            content=_result_text(result.content, result.structured_content),
            limit=context.max_output_chars,
            failed=result.is_error,
        )


async def mcp_tools_for(*, tier: Tier | None) -> list[McpTool]:
    """The tools of every enabled MCP server `tier` may use, in the servers' order; none without a tier."""
    if tier is None:
        return []
    rows = [row async for row in McpServer.objects.filter(enabled=True, tiers=tier).order_by("name")]
    return await _tools_of_rows(rows)


def mcp_tool_source(tier_id: int | None) -> list[McpTool]:
    """`mcp_tools_for` for synchronous callers (a tool registry's source, run in a database thread):
    the plan's servers' tools, with no round trip while their lists are kept."""
    if tier_id is None:
        return []
    rows = list(McpServer.objects.filter(enabled=True, tiers__id=tier_id).order_by("name"))
    kept = [_kept(row) for row in rows]
    if all(tools is not None for tools in kept):
        return [tool for tools in kept if tools is not None for tool in tools]
    return async_to_sync(_tools_of_rows)(rows)


async def _tools_of_rows(rows: list[McpServer]) -> list[McpTool]:
    listed = await asyncio.gather(*(_tools_of(row) for row in rows))
    return [tool for tools in listed for tool in tools]


def mcp_cache_clear() -> None:
    _LISTS.clear()


@asynccontextmanager
async def mcp_client(endpoint: McpEndpoint, *, timeout_s: float) -> AsyncIterator[Client]:
    """A connected client for one exchange; the connection (or the process) ends with the block."""
    if endpoint.transport == McpServer.Transport.STDIO:
        # The SDK passes the server only a handful of harmless variables (HOME, PATH, USER…), never
        # the service's own environment and its secrets.
        parameters = StdioServerParameters(command=endpoint.command, args=list(endpoint.args))
        async with Client(stdio_client(parameters), read_timeout_seconds=timeout_s, cache=None) as client:
            yield client
        return
    headers = {}
    if endpoint.auth_env_var:
        value = os.environ.get(endpoint.auth_env_var)
        if not value:
            raise McpUnavailable(f"the environment variable {endpoint.auth_env_var} is not set")
        headers[endpoint.auth_header] = value
    http = httpx2.AsyncClient(
        headers=headers, timeout=httpx2.Timeout(timeout_s), follow_redirects=False, trust_env=False
    )
    async with (
        http,
        Client(
            streamable_http_client(endpoint.url, http_client=http), read_timeout_seconds=timeout_s, cache=None
        ) as client,
    ):
        yield client


# A server's tools, as last listed: (when listed, the row's updated_at then, its tools).
_LISTS: dict[int, tuple[float, Any, list[McpTool]]] = {}


def _kept(row: McpServer) -> list[McpTool] | None:
    kept = _LISTS.get(row.id)
    if kept is not None and kept[1] == row.updated_at and time.monotonic() - kept[0] < settings.MCP_TOOLS_CACHE_S:
        return kept[2]
    return None


async def _tools_of(row: McpServer) -> list[McpTool]:
    kept = _kept(row)
    if kept is not None:
        return kept
    endpoint = McpEndpoint.from_row(row)
    try:
        async with asyncio.timeout(endpoint.timeout_s + SHUTDOWN_GRACE_S):
            async with mcp_client(endpoint, timeout_s=endpoint.timeout_s) as client:
                listed = await _list_all(client)
    except Exception as error:  # a server down or broken leaves the others' tools usable
        logger.warning("MCP server %s could not be listed: %r", endpoint.name, error)
        return []
    tools = _tools_from_listing(endpoint, listed)
    _LISTS[row.id] = (time.monotonic(), row.updated_at, tools)
    return tools


async def _list_all(client: Client) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(20):  # pages; a server that pages forever gets no more than this
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _tools_from_listing(endpoint: McpEndpoint, listed: list[Any]) -> list[McpTool]:
    tools: list[McpTool] = []
    names: set[str] = set()
    for remote in listed:
        name = f"{endpoint.name}__{NOT_IN_NAME.sub('_', remote.name)}"[:64]
        if name in names:
            logger.warning(
                "MCP server %s: tool %r left out, its name clashes once shortened", endpoint.name, remote.name
            )
            continue
        names.add(name)
        schema = remote.input_schema if isinstance(remote.input_schema, dict) else {}
        if schema.get("type") != "object":
            schema = {"type": "object", "properties": {}}
        if len(json.dumps(schema, default=str)) > MAX_SCHEMA_CHARS:
            # Every prompt that offers the tool carries its schema.
            logger.warning("MCP server %s: tool %r left out, its schema is too long", endpoint.name, remote.name)
            continue
        read_only = remote.annotations is not None and remote.annotations.read_only_hint is True
        description = (remote.description or remote.title or remote.name)[:MAX_DESCRIPTION_CHARS]
        spec = ToolSpec(name=name, description=description, parameters=schema, side_effects=not read_only)
        tools.append(McpTool(spec=spec, endpoint=endpoint, remote_name=remote.name))
    return tools


def _timed_out(error: BaseException) -> bool:
    """Whether the SDK gave up waiting for an answer (its errors come wrapped in task groups' groups)."""
    if isinstance(error, BaseExceptionGroup):
        return any(_timed_out(inner) for inner in error.exceptions)
    return isinstance(error, TimeoutError) or (isinstance(error, MCPError) and error.code == REQUEST_TIMEOUT)


def _result_text(content: list[Any], structured: Any) -> str:
    parts = []
    for block in content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content: {getattr(block, 'mime_type', '') or 'not shown'}]")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    return "\n".join(parts) or "(no content)"
