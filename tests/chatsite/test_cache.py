from __future__ import annotations

import asyncio

import pytest
from django.core.cache import caches

pytestmark = [pytest.mark.topology, pytest.mark.redis]


@pytest.fixture
def redis_cache(redis_url, settings):
    """The production cache backend on the real Redis server; a client to watch the server with."""
    import redis

    settings.CACHES = {"default": {"BACKEND": "chatsite.cache.RedisCache", "LOCATION": redis_url}}
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def connections_opened(monkeypatch):
    """How many connections to Redis this process opens from now on: counted here, as the server's
    own count takes in the other test processes' (tests/parallel.py)."""
    import redis.connection

    opened = [0]
    connect = redis.connection.AbstractConnection.connect

    def counted(self):
        if self._sock is None:
            opened[0] += 1
        return connect(self)

    monkeypatch.setattr(redis.connection.AbstractConnection, "connect", counted)
    return lambda: opened[0]


async def test_sockets_and_generations_share_one_redis_connection_for_the_cache(redis_cache, connections_opened):
    # Each WebSocket and each generation runs in an async context of its own, and Django builds a
    # cache object per context: with Django's own backend every one of them opened a connection.
    def read() -> object:
        return caches["default"].get("moderation:policy:version")

    async def in_a_new_context() -> None:
        await asyncio.to_thread(read)

    await asyncio.to_thread(read)  # the one connection this process needs
    before = connections_opened()
    for _ in range(10):
        await asyncio.create_task(in_a_new_context())
    assert connections_opened() == before


def test_the_cache_still_reads_and_writes(redis_cache):
    cache = caches["default"]
    cache.set("greeting", {"text": "hello"}, timeout=30)
    assert cache.get("greeting") == {"text": "hello"}
    cache.delete("greeting")
    assert cache.get("greeting") is None


def test_clearing_the_cache_leaves_the_queues_and_streams_that_share_its_database(redis_cache):
    cache = caches["default"]
    cache.set_many({f"policy:{n}": n for n in range(2500)}, timeout=60)  # more than one batch to delete
    redis_cache.rpush("gpu.default", "a queued task")  # Celery's queue for a deployment
    redis_cache.rpush("chatsite:stream:g1", '{"seq": 1}')  # a replay buffer
    redis_cache.set("chatsite:worker:w1", "alive")

    assert cache.clear()

    assert cache.get("policy:7") is None
    assert not list(redis_cache.scan_iter(match="chatsite:cache:*"))
    assert redis_cache.lrange("gpu.default", 0, -1) == [b"a queued task"]
    assert redis_cache.lrange("chatsite:stream:g1", 0, -1) == [b'{"seq": 1}']
    assert redis_cache.get("chatsite:worker:w1") == b"alive"
