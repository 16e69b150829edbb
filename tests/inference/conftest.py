"""What the OpenAI API's tests share: the official client with a key of a user's, and a queue that
never runs."""

from __future__ import annotations

import openai
import pytest
from channels.db import database_sync_to_async

from accounts.services import api_key_create


@pytest.fixture
def client_of(db):
    """`await client_of(server, user)`: the official async client on `server`'s /v1, with a new key
    of `user`'s for chat and the model list."""

    def make(server: str, user) -> openai.AsyncOpenAI:
        key = api_key_create(user=user, name="tests", scopes=["chat", "models:read"]).key
        return openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=180)

    return database_sync_to_async(make)


@pytest.fixture
def nothing_runs(monkeypatch):
    """Completions are queued and never dispatched: for what a request becomes, not its answer."""
    monkeypatch.setattr("inference.services.generation_dispatch", lambda **dispatch: None)
