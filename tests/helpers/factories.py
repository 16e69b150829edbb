"""The people of the tests (alice, bob, mallory, each with `PASSWORD`) and rows made for a test."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.services import user_create

PASSWORD = "a long enough password 1"


@pytest.fixture
def make_user(db):
    def make(username: str) -> Any:
        return user_create(username=username, password=PASSWORD, email=f"{username}@example.com")

    return make


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def mallory(make_user):
    return make_user("mallory")


@pytest.fixture
async def unclaimed_generation(alice, default_deployment):
    """Alice's generation, queued but never dispatched: no engine runs it, a test publishes its events."""
    from inference.models import Generation

    return await Generation.objects.acreate(
        user=alice, deployment=default_deployment, prompt_token_ids=[1], sampling={}
    )
