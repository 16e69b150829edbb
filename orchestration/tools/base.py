"""What every tool the service runs itself has in common.

A tool is described to the model by its `ToolSpec` (OpenAI's function shape: a name, a description
and a JSON schema of its arguments) and run by the orchestrator with `run()`, which is given the
arguments already checked against that schema and a `ToolContext` of whom it runs for and within
which limits. A tool never raises for a failure the model should hear about: it returns a
`ToolResult` with `failed=True` and a message, which goes back to the model as the tool turn.
Results are untrusted text, whatever the tool: the orchestrator fences and checks them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

# OpenAI's rule for a function's name, which every client and chat template expects.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    # The JSON schema of the arguments object.
    parameters: Mapping[str, Any]
    # True for anything beyond reading: the person is asked before each run (or once for the chat).
    side_effects: bool = False

    def __post_init__(self) -> None:
        if not TOOL_NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r} is not ^[A-Za-z0-9_-]{{1,64}}$")


@dataclass(frozen=True)
class ToolContext:
    """Whom a run is for, and the limits it must keep; the tool enforces the ones it can."""

    user_id: int
    conversation_id: int | None
    timeout_s: float
    max_output_chars: int
    project_id: int | None = None


@dataclass(frozen=True)
class ToolResult:
    content: str
    failed: bool = False
    # The content was cut at the context's max_output_chars.
    truncated: bool = False
    # The tool's own cost (a search provider's fee, say), in the ledger's currency.
    cost: Decimal = Decimal(0)
    # Shown to the person with the step (a run's output files, a fetched page's address), not to the model.
    details: Mapping[str, Any] = field(default_factory=dict)


class Tool(Protocol):
    spec: ToolSpec

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult: ...


def result_clipped(*, content: str, limit: int, failed: bool = False) -> ToolResult:
    """A result cut to `limit` characters, saying so."""
    if len(content) <= limit:
        return ToolResult(content=content, failed=failed)
    return ToolResult(content=content[:limit], failed=failed, truncated=True)
