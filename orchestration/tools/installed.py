"""The tools this layer brings, installed into the registry at start-up (`OrchestrationConfig.ready`):
the web tools, the code sandbox and the MCP servers' tools. Documents installs the search of files
itself, from above."""

from __future__ import annotations

from typing import cast

from orchestration.tools.base import Tool
from orchestration.tools.mcp import mcp_tool_source
from orchestration.tools.registry import tool_register, tool_source_register
from orchestration.tools.run_code import RUN_CODE, run_code_available
from orchestration.tools.web import FetchPage, WebSearch, fetch_page_enabled, web_search_enabled


def mcp_tools_for_plan(tier_id: int | None) -> list[Tool]:
    # An McpTool keeps the protocol; its spec is a frozen dataclass's field, read-only, which mypy
    # does not take for the protocol's plain attribute.
    return cast(list[Tool], mcp_tool_source(tier_id))


def tools_install() -> None:
    tool_register(WebSearch(), enabled=web_search_enabled)
    tool_register(FetchPage(), enabled=fetch_page_enabled)
    tool_register(RUN_CODE, enabled=run_code_available)
    tool_source_register(mcp_tools_for_plan)
