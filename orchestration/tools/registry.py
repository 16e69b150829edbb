"""Which tools the service runs itself, and which of them an answer is offered.

Tools come from two places: those registered once at start-up (`tool_register`: the built-in web
tools, the search of the person's files that documents registers from its `AppConfig.ready`, the
sandbox's code runner) and sources that make tools per plan (`tool_source_register`: MCP servers).
An answer is offered the tools that are registered, enabled by their configuration, and granted to
its deployment for the person's plan (`orchestration.models.ToolGrant`), and the tools its sources
hold for the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db.models import Q

from orchestration.models import ToolGrant
from orchestration.tools.base import Tool


@dataclass(frozen=True)
class _Registered:
    tool: Tool
    enabled: Callable[[], bool]


_TOOLS: dict[str, _Registered] = {}
# Each source gives the tools it holds for a plan (its id; None for a user without one).
ToolSource = Callable[[int | None], Iterable[Tool]]
_SOURCES: list[ToolSource] = []


def _always() -> bool:
    return True


def tool_register(tool: Tool, *, enabled: Callable[[], bool] = _always) -> None:
    """Make `tool` known by its name; `enabled` says, at each answer, whether its configuration lets
    it run (a web search needs its provider's address). A second tool of the same name replaces the first."""
    _TOOLS[tool.spec.name] = _Registered(tool, enabled)


def tool_unregister(name: str) -> None:
    _TOOLS.pop(name, None)


def tool_source_register(source: ToolSource) -> None:
    if source not in _SOURCES:
        _SOURCES.append(source)


def tools_known(*, tier_id: int | None = None) -> dict[str, Tool]:
    """Every tool registered and enabled now, and those the sources hold for the plan."""
    known = {name: r.tool for name, r in _TOOLS.items() if r.enabled()}
    for source in _SOURCES:
        for tool in source(tier_id):
            known.setdefault(tool.spec.name, tool)
    return known


def tool_names_granted(*, deployment_id: int, tier_id: int | None) -> set[str]:
    return set(
        ToolGrant.objects.filter(Q(tier=None) | Q(tier_id=tier_id), deployment_id=deployment_id).values_list(
            "tool", flat=True
        )
    )


def tools_offered(*, deployment_id: int, tier_id: int | None) -> dict[str, Tool]:
    """The tools an answer on `deployment_id` for a person on plan `tier_id` may call, by name: the
    registered ones granted to the deployment for the plan, and those the sources hold for the plan
    (an MCP server's row names its plans: that row is the operator's grant)."""
    granted = tool_names_granted(deployment_id=deployment_id, tier_id=tier_id)
    offered = {name: r.tool for name, r in _TOOLS.items() if name in granted and r.enabled()}
    for source in _SOURCES:
        for tool in source(tier_id):
            offered.setdefault(tool.spec.name, tool)
    return offered
