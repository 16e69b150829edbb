from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from inference.defaults import DEFAULT_DEPLOYMENT_NAME
from inference.models import ModelDeployment
from orchestration.models import ToolGrant
from orchestration.tools.registry import tool_register, tool_unregister


@pytest.fixture
def granted_tools():
    """Register tools for a test and grant them to the default deployment for every plan; gone after it."""
    names: list[str] = []

    def rows(tools, tier):
        deployment = ModelDeployment.objects.get(name=DEFAULT_DEPLOYMENT_NAME)
        for tool in tools:
            ToolGrant.objects.get_or_create(deployment=deployment, tier=tier, tool=tool.spec.name)

    async def grant(*tools, tier=None):
        for tool in tools:
            tool_register(tool)
            names.append(tool.spec.name)
        await database_sync_to_async(rows)(tools, tier)
        return tools[0] if len(tools) == 1 else tools

    yield grant
    for name in names:
        tool_unregister(name)
