"""A user holds at most CHAT_SOCKETS_PER_USER chat sockets open at once (accounts/sockets.py): the
next is closed with 4429 and a reason, a closed socket frees its place, and a place whose process
died lapses. In the embedded default the places are this process's; in the production topology
they are in Redis, counted across web processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.test import Client

from accounts.sockets import socket_place_take
from tests.helpers.sockets import _open_sockets, open_socket

pytestmark = [
    pytest.mark.topology,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("engine_not_started"),
]

TOO_MANY = 4429


@pytest.fixture(autouse=True)
def two_sockets_each(settings):
    settings.CHAT_SOCKETS_PER_USER = 2


async def refused_with(user) -> dict:
    """Open one more socket of `user`'s and return how it was closed (it is accepted, then closed, so
    that a browser hears the code and the reason)."""
    from channels.testing import WebsocketCommunicator

    from chatsite.asgi import application

    client = Client()
    await database_sync_to_async(client.force_login)(user)
    headers = [
        (b"origin", b"http://localhost"),
        (b"host", b"localhost"),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
    ]
    communicator = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    _open_sockets.append(communicator)
    connected, _ = await communicator.connect(timeout=30)
    assert connected
    return await communicator.receive_output(timeout=30)


async def test_a_socket_past_the_users_cap_is_closed_with_a_reason(alice, bob):
    for _ in range(2):
        assert (await open_socket(alice))[1]
    closed = await refused_with(alice)
    assert closed == {"type": "websocket.close", "code": TOO_MANY, "reason": "Too many open chat tabs (at most 2)."}
    assert (await open_socket(bob))[1], "another user's sockets are not counted against hers"


async def test_a_closed_socket_frees_its_place(alice):
    first, _ = await open_socket(alice)
    await open_socket(alice)
    assert (await refused_with(alice))["code"] == TOO_MANY
    await first.disconnect()
    assert (await open_socket(alice))[1]


async def test_the_place_of_a_process_that_died_lapses(alice, monkeypatch):
    # Two places taken and never given back, as a process that died with two sockets open leaves them.
    for socket_id in ("dead-1", "dead-2"):
        assert await socket_place_take(user_id=alice.id, socket_id=socket_id)
    assert (await refused_with(alice))["code"] == TOO_MANY
    await places_lapse(alice.id, monkeypatch)
    assert (await open_socket(alice))[1]


async def test_an_open_socket_renews_its_place(alice, monkeypatch, settings):
    settings.CHAT_SOCKET_PLACE_TTL_S = 3
    await open_socket(alice)
    await open_socket(alice)
    await places_lapse(alice.id, monkeypatch)
    # A renewal (every third of the TTL) later, the live sockets hold their places again.
    await asyncio.sleep(settings.CHAT_SOCKET_PLACE_TTL_S / 3 + 0.5)
    assert (await refused_with(alice))["code"] == TOO_MANY


async def places_lapse(user_id: int, monkeypatch) -> None:
    """Move the user's places past their expiry, as a TTL later: the clock in the embedded default,
    the scores in Redis (which keeps its own clock)."""
    if settings.REDIS_URL:
        import redis

        from accounts.sockets import _key

        client = redis.Redis.from_url(settings.REDIS_URL)
        client.zadd(_key(user_id), {member: 1 for member in client.zrange(_key(user_id), 0, -1)})
        return
    later = time.time() + settings.CHAT_SOCKET_PLACE_TTL_S + 1
    monkeypatch.setattr("accounts.sockets.time.time", lambda: later)


@pytest.mark.redis
@pytest.mark.skipif(not settings.REDIS_URL, reason="needs the production topology (REDIS_URL)")
async def test_places_are_counted_across_web_processes(alice, monkeypatch):
    """Another web process (a process of its own here) holds two of Alice's sockets: this one's is
    refused; once that process has died and its places lapsed, it is accepted."""
    script = (
        "import asyncio, django; django.setup()\n"
        "from accounts.sockets import socket_place_take\n"
        f"print([asyncio.run(socket_place_take(user_id={alice.id}, socket_id=f'other-{{i}}')) for i in range(2)])"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatsite.settings", "CHAT_SOCKETS_PER_USER": "2"}
    other = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert other.stdout.strip() == "[True, True]", other.stderr
    assert (await refused_with(alice))["code"] == TOO_MANY
    await places_lapse(alice.id, monkeypatch)
    assert (await open_socket(alice))[1]


@pytest.mark.skipif(not settings.REDIS_URL, reason="the places are in Redis in the production topology")
async def test_hundreds_of_sockets_taking_their_places_at_once_all_get_one():
    # A web process holds hundreds of sockets, which open (and close) in bursts: more commands at
    # once than a Redis client's pool has connections. They wait for one; none fails.
    sockets = 300
    taken = await asyncio.gather(
        *[socket_place_take(user_id=900_000 + i, socket_id=f"burst-{i}") for i in range(sockets)]
    )
    assert taken == [True] * sockets
