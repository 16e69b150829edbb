"""Django's Redis cache with one client, and so one connection pool, per process.

Django keeps a cache object per async context (`caches` is an asgiref `Local`): every WebSocket
connection and every generation on a worker's engine loop starts without one and builds its own,
and with it a new connection pool. Their first cache read then opens a new connection to Redis
(connect, then the client's handshake), on the path of a message to its first token, and with
eight messages at once their database threads queue up for it. Here every cache object of the
process shares one client; redis-py's pools are thread-safe.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[tuple[tuple[str, ...], str], RedisCacheClient] = {}
_clients_lock = threading.Lock()


class RedisCache(DjangoRedisCache):
    @cached_property
    def _cache(self) -> Any:
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(self._servers, **self._options)
        return client
