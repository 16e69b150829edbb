"""Token buckets: the rate-limit algorithm behind requests-per-minute and tokens-per-minute.

A bucket holds up to `capacity` units and refills continuously at `capacity / period` units a
second. A request that costs `amount` units is admitted when the bucket holds at least that many;
they are taken out in the same step. Otherwise nothing is taken and the caller learns how many
seconds until enough will have refilled (`retry_after`, rounded up). A full bucket allows a burst
of `capacity` at once, after which the sustained rate is `capacity` per `period`: exactly "N per
minute" without the double burst a fixed window allows at its edges.

A bucket's state is two numbers, the units left and when they were counted; the refill is computed
lazily when the bucket is next touched, so idle buckets cost nothing and simply expire.

A request that pays into several buckets (requests a minute and tokens a minute) pays into all of
them in one step, or into none (`buckets_consume`): refused by one, it has taken nothing from the
others, so there is nothing to give back.

Atomicity is the whole point under concurrent bursts:
- with `settings.REDIS_URL` the read-refill-take step is one Lua script over all the request's
  buckets, which Redis runs atomically and with its own clock (`TIME`), so any number of web
  processes share one bucket correctly, in one round trip a request;
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

from chatsite.redis_clients import redis_client

KEY_PREFIX = "rl:"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    remaining: float
    retry_after: int  # seconds; 0 when allowed


# KEYS: the buckets; ARGV: capacity, refill per second and amount (negative: a refund) for each, in
# turn. Every bucket is refilled; the amounts are taken only if every bucket holds its own, otherwise
# nothing is taken. Returns {refused (the 1-based index of the first bucket short of its amount, 0
# when all were taken), that bucket's remaining*1000 (the last bucket's when all were taken), its retry_ms}.
_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local levels = {}
local refused = 0
for i, key in ipairs(KEYS) do
  local capacity = tonumber(ARGV[3 * i - 2])
  local rate = tonumber(ARGV[3 * i - 1])
  local amount = tonumber(ARGV[3 * i])
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1])
  local ts = tonumber(state[2])
  if tokens == nil then
    tokens = capacity
    ts = now
  end
  tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
  levels[i] = tokens
  if refused == 0 and amount > tokens then
    refused = i
  end
end
if refused > 0 then
  local rate = tonumber(ARGV[3 * refused - 1])
  local amount = tonumber(ARGV[3 * refused])
  local tokens = levels[refused]
  return {refused, math.floor(tokens * 1000), math.ceil((amount - tokens) / rate * 1000)}
end
local last = 0
for i, key in ipairs(KEYS) do
  local capacity = tonumber(ARGV[3 * i - 2])
  local rate = tonumber(ARGV[3 * i - 1])
  local tokens = math.min(capacity, levels[i] - tonumber(ARGV[3 * i]))
  redis.call('HSET', key, 'tokens', tostring(tokens), 'ts', tostring(now))
  redis.call('PEXPIRE', key, math.ceil(capacity / rate * 1000) + 1000)
  last = tokens
end
return {0, math.floor(last * 1000), 0}
"""

# KEYS: the buckets; ARGV: capacity and refill per second for each, in turn. Returns each bucket's
# units now (*1000), refilled but untouched: what a client is told it has left.
_PEEK_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local levels = {}
for i, key in ipairs(KEYS) do
  local capacity = tonumber(ARGV[2 * i - 1])
  local rate = tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1])
  local ts = tonumber(state[2])
  if tokens == nil then
    levels[i] = math.floor(capacity * 1000)
  else
    levels[i] = math.floor(math.min(capacity, tokens + math.max(0, now - ts) * rate) * 1000)
  end
end
return levels
"""

_local_lock = threading.Lock()


@cache
def _redis_script(url: str):
    return redis_client(url).register_script(_LUA)


@cache
def _redis_peek_script(url: str):
    return redis_client(url).register_script(_PEEK_LUA)


@dataclass(frozen=True)
class Charge:
    """`amount` units from the bucket `key`, which holds `capacity` units a `period_s`."""

    key: str
    capacity: int
    period_s: float
    amount: float = 1


@dataclass(frozen=True)
class Refusal:
    """Which charge of several its bucket could not pay (its index), and when to come back."""

    index: int
    retry_after: int  # seconds


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
    refused, remaining, retry_after = _take([Charge(key, capacity, period_s, amount)])
    return Decision(not refused, remaining, retry_after)


def buckets_consume(charges: list[Charge]) -> Refusal | None:
    """Take each charge's amount from its bucket, all of them or none: None when all were taken,
    else the first charge whose bucket is short and when it will have refilled enough.

    One step for all the buckets a request pays into (one round trip to Redis), so a request refused
    by its second bucket has taken nothing from its first, and two racing requests never each take
    from the bucket the other is refused by.
    """
    refused, _, retry_after = _take(charges)
    return Refusal(refused - 1, retry_after) if refused else None


def bucket_refund(*, key: str, capacity: int, period_s: float, amount: float) -> None:
    """Give back units taken for a request that was refused further on (never above capacity)."""
    buckets_refund([Charge(key, capacity, period_s, amount)])


def buckets_refund(charges: list[Charge]) -> None:
    """Give back what `buckets_consume` took for a request that went no further after all (never
    above a bucket's capacity), in one step."""
    for charge in charges:
        _validate(charge.capacity, charge.period_s, charge.amount)
    refunds = [Charge(KEY_PREFIX + c.key, c.capacity, c.period_s, -c.amount) for c in charges if c.amount]
    if refunds:
        _apply(refunds)


def buckets_peek(charges: list[Charge]) -> list[float]:
    """The units each charge's bucket holds now (refilled, a new one full), taking nothing: for
    telling a client what it has left. The charges' amounts are ignored."""
    for charge in charges:
        _validate(charge.capacity, charge.period_s, 0)
    if not charges:
        return []
    if settings.REDIS_URL:
        args = []
        for charge in charges:
            args += [charge.capacity, repr(charge.capacity / charge.period_s)]
        levels = _redis_peek_script(settings.REDIS_URL)(keys=[KEY_PREFIX + c.key for c in charges], args=args)
        return [level / 1000 for level in levels]
    now = time.time()
    with _local_lock:
        states = [django_cache.get(KEY_PREFIX + charge.key) for charge in charges]
    return [
        float(charge.capacity)
        if state is None
        else min(float(charge.capacity), state[0] + max(0.0, now - state[1]) * charge.capacity / charge.period_s)
        for charge, state in zip(charges, states, strict=True)
    ]


def buckets_reset(keys: list[str]) -> None:
    """Fill the buckets `keys` again at once (an admin lifting a lock), by forgetting them."""
    if not keys:
        return
    if settings.REDIS_URL:
        _redis_script(settings.REDIS_URL).registered_client.delete(*[KEY_PREFIX + key for key in keys])
        return
    with _local_lock:
        django_cache.delete_many([KEY_PREFIX + key for key in keys])


def _take(charges: list[Charge]) -> tuple[int, float, int]:
    """`_apply` for charges, after refusing one larger than its whole bucket without touching any."""
    for index, charge in enumerate(charges):
        _validate(charge.capacity, charge.period_s, charge.amount)
        if charge.amount > charge.capacity:
            return index + 1, 0.0, math.ceil(charge.period_s)
    if not charges:
        return 0, 0.0, 0
    return _apply([Charge(KEY_PREFIX + c.key, c.capacity, c.period_s, c.amount) for c in charges])


def _apply(charges: list[Charge]) -> tuple[int, float, int]:
    """(the 1-based index of the first bucket short of its charge, 0 if all were taken; units left
    in that bucket, or in the last one; seconds until it has refilled enough, 0 if all were taken)."""
    if settings.REDIS_URL:
        args = []
        for charge in charges:
            args += [charge.capacity, repr(charge.capacity / charge.period_s), repr(float(charge.amount))]
        refused, remaining_milli, retry_ms = _redis_script(settings.REDIS_URL)(
            keys=[charge.key for charge in charges], args=args
        )
        return refused, remaining_milli / 1000, math.ceil(retry_ms / 1000) if refused else 0
    return _local_consume(charges)


def _local_consume(charges: list[Charge]) -> tuple[int, float, int]:
    with _local_lock:
        now = time.time()
        levels = []
        for charge in charges:
            tokens, ts = django_cache.get(charge.key) or (float(charge.capacity), now)
            levels.append(min(float(charge.capacity), tokens + max(0.0, now - ts) * charge.capacity / charge.period_s))
        for index, (charge, tokens) in enumerate(zip(charges, levels, strict=True)):
            if charge.amount > tokens:
                rate = charge.capacity / charge.period_s
                return index + 1, tokens, math.ceil((charge.amount - tokens) / rate)
        tokens = 0.0
        for charge, level in zip(charges, levels, strict=True):
            tokens = min(float(charge.capacity), level - charge.amount)
            django_cache.set(charge.key, (tokens, now), timeout=math.ceil(charge.period_s) + 1)
        return 0, tokens, 0
