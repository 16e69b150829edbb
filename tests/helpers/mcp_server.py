"""A small MCP server of the tests' own, on the official SDK, for orchestration.tools.mcp's tests:
`python -m tests.helpers.mcp_server http PORT` serves it over Streamable HTTP on loopback,
`python -m tests.helpers.mcp_server stdio` over its standard input and output."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import create_model

server = MCPServer("test-tools")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def note(text: str) -> str:
    """Keep a note (a tool with side effects: it has no read-only hint)."""
    return f"kept: {text}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def broken() -> str:
    """Always fails, saying why."""
    raise ToolError("broken on purpose")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def crash() -> str:
    """Always crashes (an exception the server does not expect)."""
    raise RuntimeError("an internal detail")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def hang() -> str:
    """Never answers."""
    await asyncio.sleep(3600)
    return "late"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def environment(name: str) -> str:
    """What the server's environment holds under `name`, in brackets (empty ones when nothing)."""
    return f"[{os.environ.get(name, '')}]"


# Four hundred fields: a schema far too long to offer in every prompt.
Sprawling = create_model("Sprawling", **{f"field_{i}": (str, "") for i in range(400)})  # type: ignore[call-overload]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def sprawling(fields: Sprawling) -> str:  # type: ignore[valid-type]
    """A tool whose schema is too long to offer."""
    return ""


if __name__ == "__main__":
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
