"""The deployments and plans every test starts with: the default deployment on the test's engine,
the plans and staff groups its migrations made, and fixtures that narrow them for a test."""

from __future__ import annotations

import pytest

from accounts.defaults import create_default_tiers
from accounts.models import Tier
from billing.models import TierModelPrice
from inference.defaults import (
    DEFAULT_DEPLOYMENT_FIELDS,
    DEFAULT_DEPLOYMENT_NAME,
    DEFAULT_DEPLOYMENT_TOOL_FIELDS,
    EMBEDDING_DEPLOYMENT_FIELDS,
    EMBEDDING_DEPLOYMENT_NAME,
)
from inference.models import ModelDeployment
from inference.selectors import deployment_cache_clear
from orchestration.models import ToolGrant
from orchestration.tools.registry import tool_register, tool_unregister
from tests.helpers.engines import engine_kind_for


@pytest.fixture(autouse=True)
def default_deployment(request):
    """Transactional tests flush the migrations' rows; put them back for every test that uses the database.
    A rolled-back test's ids are given again to the next test's rows, so the deployments this process
    read by id are forgotten too: a later test's message would otherwise run on an earlier test's
    deployment (an engine of another model loading in the middle of it)."""
    deployment_cache_clear()
    if not ({"db", "transactional_db"} & set(request.fixturenames)) and not request.node.get_closest_marker(
        "django_db"
    ):
        return None
    request.getfixturevalue("transactional_db" if "transactional_db" in request.fixturenames else "db")
    kind = engine_kind_for(request)
    deployment, _ = ModelDeployment.objects.get_or_create(
        name=DEFAULT_DEPLOYMENT_NAME,
        defaults={**DEFAULT_DEPLOYMENT_FIELDS, **DEFAULT_DEPLOYMENT_TOOL_FIELDS, "engine": kind},
    )
    if deployment.engine != kind:
        ModelDeployment.objects.filter(id=deployment.id).update(engine=kind)
        deployment.engine = kind
    create_default_tiers(tier_model=Tier, price_model=TierModelPrice, deployment=deployment)
    # The embedding model's row, which the same migrations make (files are charged on it).
    ModelDeployment.objects.get_or_create(name=EMBEDDING_DEPLOYMENT_NAME, defaults=EMBEDDING_DEPLOYMENT_FIELDS)
    staff_groups_restore()
    return deployment


@pytest.fixture(autouse=True)
def deployments_on_the_tests_engine(request, monkeypatch):
    """Every deployment a test creates without naming an engine runs on the test's (`engine_kind_for`),
    as the default deployment does: the row says so, so a Celery worker reads it too."""
    kind = engine_kind_for(request)
    monkeypatch.setattr(ModelDeployment._meta.get_field("engine"), "_get_default", lambda: kind, raising=False)


@pytest.fixture
def draws_the_heaviest(monkeypatch):
    """The weighted draw of a send lands on the heaviest deployment: a test that needs the canary
    drawn first would otherwise miss it now and then (1000 against 100 is one draw in eleven)."""

    class Heaviest:
        @staticmethod
        def choices(population, weights):
            return [population[weights.index(max(weights))]]

    monkeypatch.setattr("orchestration.routing.random", Heaviest)


def staff_groups_restore() -> None:
    """The staff groups the migration creates, put back after a transactional test's flush (the fault
    tests, which run first, flush before any other test has read them)."""
    from django.contrib.auth.models import Group, Permission

    from accounts.defaults import create_staff_groups

    if Group.objects.filter(name="Moderators").exists():
        return
    create_staff_groups(group_model=Group, permission_model=Permission)
    # moderation's own migration adds the review queue's permission to the same group.
    Group.objects.get(name="Moderators").permissions.add(
        Permission.objects.get(content_type__app_label="moderation", codename="review_flag")
    )


@pytest.fixture
def short_answers(default_deployment):
    """The free plan's answers cut at 48 tokens, for tests about what happens around an answer (its
    branches, its stream in another tab, a request sent again), not about what it says: each is then
    written in seconds on a slow machine rather than running on to 512. (Tests that use it are
    marked for the database.)"""
    Tier.objects.filter(name="free").update(max_output_tokens=48)


@pytest.fixture
def granted_tools():
    """`await granted_tools(tool, ...)`: register tools for a test and grant them to the default
    deployment for every plan (or `tier`); unregistered after it. A tool already registered (a
    built-in) is granted by passing its name."""
    from channels.db import database_sync_to_async

    names: list[str] = []

    def rows(tool_names, tier):
        deployment = ModelDeployment.objects.get(name=DEFAULT_DEPLOYMENT_NAME)
        for name in tool_names:
            ToolGrant.objects.get_or_create(deployment=deployment, tier=tier, tool=name)

    async def grant(*tools, tier=None):
        for tool in tools:
            if not isinstance(tool, str):
                tool_register(tool)
                names.append(tool.spec.name)
        await database_sync_to_async(rows)([t if isinstance(t, str) else t.spec.name for t in tools], tier)
        return tools[0] if len(tools) == 1 else tools

    yield grant
    for name in names:
        tool_unregister(name)


@pytest.fixture
def granted_tools_sync():
    """`granted_tools` for a sync test."""
    names: list[str] = []

    def grant(*tools, tier=None):
        deployment = ModelDeployment.objects.get(name=DEFAULT_DEPLOYMENT_NAME)
        for tool in tools:
            tool_register(tool)
            names.append(tool.spec.name)
            ToolGrant.objects.get_or_create(deployment=deployment, tier=tier, tool=tool.spec.name)

    yield grant
    for name in names:
        tool_unregister(name)
