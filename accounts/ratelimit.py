"""Token buckets: the rate-limit algorithm behind requests-per-minute and tokens-per-minute.

A bucket holds up to `capacity` units and refills continuously at `capacity / period` units a
second. A request that costs `amount` units is admitted when the bucket holds at least that many;
they are taken out in the same step. Otherwise nothing is taken and the caller learns how many
seconds until enough will have refilled (`retry_after`, rounded up). A full bucket allows a burst
of `capacity` at once, after which the sustained rate is `capacity` per `period`: exactly "N per
minute" without the double burst a fixed window allows at its edges.

A bucket's state is two numbers, the units left and when they were counted; the refill is computed
lazily when the bucket is next touched, so idle buckets cost nothing and simply expire.

Atomicity is the whole point under concurrent bursts:
- with `settings.REDIS_URL` the read-refill-take step is one Lua script, which Redis runs atomically
  and with its own clock (`TIME`), so any number of web processes share one bucket correctly;
- without it (the embedded default is a single process) the step runs under a process-wide lock
  around Django's cache.

Keys name the bucket's owner: a user id or an API key id, never anything a client sends.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.core.cache import cache as django_cache

KEY_PREFIX = "rl:"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    remaining: float
    retry_after: int  # seconds; 0 when allowed


# KEYS[1] bucket; ARGV: capacity, refill per second, amount (negative: a refund). Returns {allowed, remaining*1000, retry_ms}.
_LUA = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local amount = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil then
  tokens = capacity
  ts = now
end
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
local retry_ms = 0
if amount <= tokens then
  tokens = math.min(capacity, tokens - amount)
  allowed = 1
else
  retry_ms = math.ceil((amount - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)
return {allowed, math.floor(tokens * 1000), retry_ms}
"""

_local_lock = threading.Lock()


@cache
def _redis_script(url: str):
    import redis

    client = redis.Redis.from_url(url)
    return client.register_script(_LUA)


def _validate(capacity: int, period_s: float, amount: float) -> None:
    if capacity <= 0 or period_s <= 0:
        raise ValueError("a bucket needs a positive capacity and period")
    if amount < 0:
        raise ValueError("amount must not be negative")


def bucket_consume(*, key: str, capacity: int, period_s: float, amount: float = 1) -> Decision:
    """Take `amount` units from the bucket `key` (capacity units per period_s) if it holds them.

    A request costing more than the whole capacity could never pass; it is refused with the time a
    full bucket takes to refill, so the client is told something true rather than "never".
    """
    _validate(capacity, period_s, amount)
    rate = capacity / period_s
    if amount > capacity:
        return Decision(False, 0.0, math.ceil(period_s))
    return _apply(KEY_PREFIX + key, capacity=capacity, rate=rate, amount=amount)


def bucket_refund(*, key: str, capacity: int, period_s: float, amount: float) -> None:
    """Give back units taken for a request that was refused further on (never above capacity)."""
    _validate(capacity, period_s, amount)
    if amount:
        _apply(KEY_PREFIX + key, capacity=capacity, rate=capacity / period_s, amount=-amount)


def _apply(key: str, *, capacity: int, rate: float, amount: float) -> Decision:
    if settings.REDIS_URL:
        allowed, remaining_milli, retry_ms = _redis_script(settings.REDIS_URL)(
            keys=[key], args=[capacity, repr(rate), repr(float(amount))]
        )
        return Decision(bool(allowed), remaining_milli / 1000, math.ceil(retry_ms / 1000) if not allowed else 0)
    return _local_consume(key, capacity=capacity, rate=rate, amount=amount)


def _local_consume(key: str, *, capacity: int, rate: float, amount: float) -> Decision:
    with _local_lock:
        now = time.time()
        tokens, ts = django_cache.get(key) or (float(capacity), now)
        tokens = min(float(capacity), tokens + max(0.0, now - ts) * rate)
        if amount <= tokens:
            tokens = min(float(capacity), tokens - amount)
            decision = Decision(True, tokens, 0)
        else:
            decision = Decision(False, tokens, math.ceil((amount - tokens) / rate))
        django_cache.set(key, (tokens, now), timeout=math.ceil(capacity / rate) + 1)
        return decision
