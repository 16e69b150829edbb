"""The chat socket in tests: opened through the real ASGI stack, read past the broadcasts, closed after
each test; and helpers for answers stopped while they stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from channels.db import database_sync_to_async

# Broadcasts a socket may hear at any time: the engine's state, a conversation's title (it comes as
# a first answer ends), a message another socket of the same user sent.
BROADCASTS = ("engine.status", "conversation.title", "conversation.message")
ENGINE_STATUS = ("engine.status",)


async def next_event(communicator, *, timeout: float = 60, skipping: tuple[str, ...] = BROADCASTS) -> dict[str, Any]:
    """The next event for this socket, skipping the broadcasts (they come at any time)."""
    while True:
        event = await communicator.receive_json_from(timeout=timeout)
        if event["type"] not in skipping:
            return event


async def events_but_broadcasts(
    communicator, *, timeout: float, skipping: tuple[str, ...] = BROADCASTS
) -> list[dict[str, Any]]:
    """Every event a socket receives within `timeout` seconds but the broadcasts, which may come at
    any time (a worker starting elsewhere in the run says its engine's state to every socket). A
    socket that must hear nothing of another user's chats skips only ENGINE_STATUS."""
    events = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0 and not await communicator.receive_nothing(timeout=left):
        event = await communicator.receive_json_from(timeout=5)
        if event["type"] not in skipping:
            events.append(event)
    return events


async def drain_until_finished(communicator, *, timeout: float = 60) -> list[dict[str, Any]]:
    """Every event a socket receives until its stream ends (done, error or a refused request)."""
    events = []
    while True:
        event = await next_event(communicator, timeout=timeout)
        events.append(event)
        if event["type"] in ("generation.done", "generation.error", "error"):
            return events


_open_sockets: list[Any] = []


@pytest.fixture(autouse=True)
async def sockets_closed_after_each_test():
    """Closes the sockets a test left open. A consumer left running would go on receiving from the
    channel layer through the tests after it, and its pending receive kept the run from ending."""
    yield
    while _open_sockets:
        communicator = _open_sockets.pop()
        if not communicator.future.done():
            with contextlib.suppress(Exception):
                await communicator.disconnect(timeout=5)


async def open_socket(
    user=None, *, origin: str = "http://localhost", path: str = "/ws/chat/", host: str = "localhost", client=None
):
    """A WebsocketCommunicator through the real ASGI stack (origin check, session auth, routing),
    opened as the page at `host` (http) would open it. With `client` (a test Client signed in
    already) it carries that client's session, else a new session of `user`'s.

    Returns the communicator and whether it connected; a connected one has had its greeting read.
    """
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from chatsite.asgi import application

    headers = [(b"origin", origin.encode())] if origin else []
    if host:
        headers.append((b"host", host.encode()))
    if user is not None and client is None:
        client = Client()
        await database_sync_to_async(client.force_login)(user)
    if client is not None:
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    _open_sockets.append(communicator)  # a refused one too: its consumer runs until told of the close
    connected, _ = await communicator.connect(timeout=30)
    if connected:
        greeting = await communicator.receive_json_from(timeout=30)
        assert greeting["type"] == "engine.status"
    return communicator, connected


async def stopped_while_streaming(attempt: Callable[[], Any], *, tries: int = 3) -> Any:
    """Run `attempt` until its answer was still streaming when it was stopped; returns what it saw.

    `attempt` starts an answer, stops it mid-stream (a stop, a client gone) and returns what it saw
    and whether the answer was still running then. A try whose answer had already ended says nothing
    about stopping: this process may have stood still until the end (the loop-stall warning in the
    log says so). The test asserts on the try that counted.
    """
    ended_first = []
    for _ in range(tries):
        seen, running = await attempt()
        if running:
            return seen
        ended_first.append(seen)
    pytest.fail(f"each answer had ended before it was stopped: {ended_first}")


async def generation_once_finished(user) -> Any:
    """The user's (only) generation once it has ended, or as it stands after 10 s: an answer stopped
    by a client that left ends a moment after the response does."""
    from inference.models import Generation

    for _ in range(100):
        generation = await Generation.objects.filter(user=user).afirst()
        if generation.is_finished:
            break
        await asyncio.sleep(0.1)
    return generation


async def ended_in_the_database_once_queued(user, **row) -> Any:
    """Wait for `user`'s (only) generation to be queued, then end it in the database only, as another
    process or a reaper that could not reach the stream's buffer does: no event announces it."""
    from inference.models import Generation

    for _ in range(200):
        generation = await Generation.objects.filter(user=user).afirst()
        if generation is not None:
            await Generation.objects.filter(id=generation.id).aupdate(**row)
            return generation
        await asyncio.sleep(0.05)
    raise AssertionError("no generation was queued within 10 s")


def layer_channels() -> set[str]:
    """The channels the process's channel layer holds for a reader: queued in memory, or subscribed to
    on Redis (channels_redis's pub/sub layer)."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    held = layer._get_layer().channels if hasattr(layer, "_get_layer") else layer.channels
    return set(held)


class DropsLiveSends:
    """A channel layer that loses every group_send, as live delivery may: the publisher has written
    the event to the replay buffer first, but it never arrives live."""

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        return None


@pytest.fixture
def followers_give_up_at_once(settings, monkeypatch):
    """A follower gives up after half a second without an event, not after an answer's time limit."""
    from inference.streaming import following

    settings.INFERENCE_GENERATION_TIMEOUT_S = 0
    settings.INFERENCE_STREAM_RESYNC_S = 0.1
    monkeypatch.setattr(following, "FOLLOW_GRACE_S", 0.5)
