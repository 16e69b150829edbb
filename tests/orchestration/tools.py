"""Tools for the tool loop's tests: what each does is in its name."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from orchestration.tools.base import ToolContext, ToolResult, ToolSpec

QUERY = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 200}},
    "required": ["text"],
    "additionalProperties": False,
}


class Echo:
    spec = ToolSpec(name="echo", description="Says back what it is given.", parameters=QUERY)

    def __init__(self, *, reply: str = "The echo heard: {text}", cost: Decimal = Decimal(0)) -> None:
        self.reply = reply
        self.cost = cost
        self.runs: list[Mapping[str, Any]] = []

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        self.runs.append(dict(arguments))
        return ToolResult(content=self.reply.format(**arguments), cost=self.cost)


class Failing:
    spec = ToolSpec(name="failing", description="Always fails.", parameters=QUERY)

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        raise RuntimeError("the tool broke")


class Hanging:
    spec = ToolSpec(name="hanging", description="Never answers.", parameters=QUERY)

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return ToolResult(content="never")


class Sending:
    """A tool with side effects: the person is asked first."""

    spec = ToolSpec(name="send_note", description="Sends a note.", parameters=QUERY, side_effects=True)

    def __init__(self) -> None:
        self.runs: list[Mapping[str, Any]] = []

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        self.runs.append(dict(arguments))
        return ToolResult(content="The note was sent.")
