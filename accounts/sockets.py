"""Places for a user's open chat sockets: at most `settings.CHAT_SOCKETS_PER_USER` at once.

Each open socket holds a place: a member of its user's set, with an expiry time. Taking a place
first forgets the expired members, then adds this one if the set has room (or it is a member
already: taking again renews it). The socket renews its place every `CHAT_SOCKET_PLACE_TTL_S / 3`
and gives it back when it closes; a process that dies without giving its places back loses them
when they expire, so a crash never keeps a user out for longer than the TTL.

- With `settings.REDIS_URL` (the production topology) the set is a Redis sorted set scored by
  expiry in Redis's own clock, and the step is one Lua script: atomic across web processes, so the
  cap holds for the user however many processes serve their sockets.
- Without (the embedded default, one process) the set lives in Django's local cache, under a
  process-wide lock.

The keys sit under the rate limits' prefix (`accounts.ratelimit.KEY_PREFIX`): they are limits too,
and are emptied with them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Any

from django.conf import settings
from django.core.cache import cache as django_cache

from accounts.ratelimit import KEY_PREFIX
from chatsite.redis_clients import redis_async_client

# KEYS[1]: the user's set; ARGV: the socket's id, the cap, the place's lifetime in ms. 1: taken.
_TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
return 0
"""

_local_lock = threading.Lock()
# Per event loop and Redis URL, held weakly: redis.asyncio connections belong to the loop that opened them.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()


def _key(user_id: int) -> str:
    return f"{KEY_PREFIX}sockets:user:{user_id}"


def _client(url: str) -> Any:
    per_url = _clients.setdefault(asyncio.get_running_loop(), {})
    client = per_url.get(url)
    if client is None:
        client = per_url[url] = redis_async_client(url)
    return client


async def socket_place_take(*, user_id: int, socket_id: str) -> bool:
    """Take (or renew) the socket's place among its user's open sockets; False when all are taken
    by others. Always True when the cap is 0 (no limit)."""
    capacity = settings.CHAT_SOCKETS_PER_USER
    if not capacity:
        return True
    ttl_s = settings.CHAT_SOCKET_PLACE_TTL_S
    if settings.REDIS_URL:
        taken = await _client(settings.REDIS_URL).eval(_TAKE_LUA, 1, _key(user_id), socket_id, capacity, ttl_s * 1000)
        return bool(taken)
    with _local_lock:
        now = time.time()
        places = {s: expiry for s, expiry in (django_cache.get(_key(user_id)) or {}).items() if expiry > now}
        if socket_id not in places and len(places) >= capacity:
            return False
        places[socket_id] = now + ttl_s
        django_cache.set(_key(user_id), places, timeout=ttl_s + 1)
        return True


async def socket_place_give_back(*, user_id: int, socket_id: str) -> None:
    """Free the socket's place (it has closed); nothing if it held none."""
    if settings.REDIS_URL:
        await _client(settings.REDIS_URL).zrem(_key(user_id), socket_id)
        return
    with _local_lock:
        places = django_cache.get(_key(user_id)) or {}
        if places.pop(socket_id, None) is not None:
            django_cache.set(_key(user_id), places, timeout=settings.CHAT_SOCKET_PLACE_TTL_S + 1)
