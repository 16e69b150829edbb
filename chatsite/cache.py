"""Django's Redis cache with one client, and so one connection pool, per process.

Django keeps a cache object per async context (`caches` is an asgiref `Local`): every WebSocket
connection and every generation on a worker's engine loop starts without one and builds its own,
and with it a new connection pool. Their first cache read then opens a new connection to Redis
(connect, then the client's handshake), on the path of a message to its first token, and with
eight messages at once their database threads queue up for it. Here every cache object of the
process shares one client; redis-py's pools are thread-safe.

Django's `clear()` empties the whole Redis database (FLUSHDB). That database also holds the Celery
queues, the channel layer, the replay buffers and the workers' liveness keys, so clearing the cache
would drop queued answers and live streams. Here `clear()` deletes only the cache's own keys: those
under its KEY_PREFIX (DEFAULT_KEY_PREFIX when the settings give none).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[tuple[tuple[str, ...], str], RedisCacheClient] = {}
_clients_lock = threading.Lock()


DEFAULT_KEY_PREFIX = "chatsite:cache"


class RedisCache(DjangoRedisCache):
    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self.key_prefix = self.key_prefix or DEFAULT_KEY_PREFIX
        # What Django's own __init__ keeps in private attributes, read here from the settings.
        self.servers = re.split("[;,]", server) if isinstance(server, str) else list(server)
        self.options = params.get("OPTIONS", {})

    @cached_property
    def _cache(self) -> Any:
        key = (tuple(self.servers), repr(sorted(self.options.items())))
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = RedisCacheClient(self.servers, **self.options)
        return client

    def clear(self) -> bool:  # type: ignore[override]  # Django's Redis cache returns whether it deleted
        return keys_delete(self._cache.get_client(write=True), prefix=self.key_prefix + ":") > 0


def keys_delete(client: Any, *, prefix: str) -> int:
    """Delete every key that starts with `prefix` (SCAN, then UNLINK in batches); how many were."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=_glob_escape(prefix) + "*", count=1000):
        batch.append(key)
        if len(batch) == 1000:
            deleted += client.unlink(*batch)
            batch = []
    if batch:
        deleted += client.unlink(*batch)
    return deleted


def _glob_escape(text: str) -> str:
    """`text` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)
