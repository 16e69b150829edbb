"""The worker's asynchronous Redis clients: one per event loop, and gone with their loop."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from inference.execution import workers

pytestmark = pytest.mark.topology


async def _clients() -> tuple:
    return workers._async_redis(), workers._async_redis(), workers._async_redis(socket_timeout=None)


def _held() -> list:
    return [client for clients in workers._async_clients.values() for client in clients.values()]


def test_each_loop_has_its_own_clients_and_a_closed_loops_are_dropped(settings):
    # A client connects on its first command only: none is opened here.
    settings.REDIS_URL = "redis://127.0.0.1:6379/15"
    first = asyncio.new_event_loop()
    client, same, other_options = first.run_until_complete(_clients())
    assert client is same
    assert client is not other_options
    second = asyncio.new_event_loop()
    try:
        on_second, *_ = second.run_until_complete(_clients())
        assert on_second is not client

        # A new loop may get a closed one's id; it must never get the closed loop's clients.
        first.close()
        first_gone = weakref.ref(first)
        del first
        gc.collect()
        assert first_gone() is None
        held = _held()
        assert not any(c is client or c is other_options for c in held)
        assert any(c is on_second for c in held)
    finally:
        second.close()
