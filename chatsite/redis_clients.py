"""Every Redis client the project makes, with one policy for connections that went stale.

A pooled connection outlives a Redis restart on the client's side: the first command sent on it
after the restart fails, the server having closed it. redis-py's sync pool checks a connection as it
hands it out; redis.asyncio's does not, so without a retry that first command's error reached the
caller: a worker's answer failed with `ConnectionError`, a chat socket's `group_add` or replay read
crashed. Every client here retries a command that fails with a connection error or a timeout, on a
new connection, up to REDIS_RETRIES times with a short exponential backoff, and pings a connection
idle for REDIS_HEALTH_CHECK_S before using it: one stale connection costs a retry, not a message.

A retried command whose reply was lost may have run twice. What the project sends is harmless
twice: heartbeats (SET, ZADD, EXPIRE), replay-buffer events and their PUBLISH (a follower drops a
`seq` it has seen), cache writes, pub/sub notices; a rate-limit step may charge its bucket twice.

A redis.asyncio client's pool opens at most REDIS_ASYNC_POOL_SIZE connections, and a command that
finds them all busy waits up to REDIS_ASYNC_POOL_WAIT_S for one (`BlockingConnectionPool`).
redis.asyncio's own pool fails such a command at once with "Too many connections": a web process
holding 500 chat sockets, which take and give back their places and read their replay buffers in
bursts, lost commands so (docs/performance-relay.md).

The Celery broker (kombu) makes its own clients: CELERY_BROKER_TRANSPORT_OPTIONS gives them the
health check and the connect timeout, not the retries (chatsite/settings.py says why).
"""

from __future__ import annotations

from typing import Any

# Waits of 0.1, 0.2, 0.4, 0.8 and 1 s: about 2.5 s in all, longer than a Redis takes to restart.
REDIS_RETRIES = 5
REDIS_BACKOFF_BASE_S = 0.05
REDIS_BACKOFF_CAP_S = 1.0
REDIS_HEALTH_CHECK_S = 15
# Without one, connecting to a host that does not answer (one restarting behind a proxy) waits for
# the operating system's TCP timeout, minutes, with the caller stuck on it.
REDIS_CONNECT_TIMEOUT_S = 5.0
# redis.asyncio's own cap a pool (one pool a client, one client a loop per use); a command waits
# this long for a free connection before it fails.
REDIS_ASYNC_POOL_SIZE = 100
REDIS_ASYNC_POOL_WAIT_S = 10.0


def redis_connection_options(*, asynchronous: bool = False) -> dict[str, Any]:
    """Keyword arguments for a redis-py client or connection pool (sync, or redis.asyncio)."""
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, TimeoutError
    from redis.retry import Retry

    retry_class = AsyncRetry if asynchronous else Retry
    return {
        "retry": retry_class(ExponentialBackoff(cap=REDIS_BACKOFF_CAP_S, base=REDIS_BACKOFF_BASE_S), REDIS_RETRIES),
        "retry_on_error": [ConnectionError, TimeoutError],
        "health_check_interval": REDIS_HEALTH_CHECK_S,
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S,
    }


def redis_client(url: str, **options: Any) -> Any:
    """A sync client for `url`; `options` add to or override the shared ones."""
    import redis

    return redis.Redis.from_url(url, **{**redis_connection_options(), **options})


def redis_async_client(url: str, **options: Any) -> Any:
    """A redis.asyncio client for `url`, whose commands wait for a free connection when its pool's
    REDIS_ASYNC_POOL_SIZE are all in use. Its connections belong to the event loop that opens them:
    keep one client per loop."""
    import redis.asyncio as aredis

    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=REDIS_ASYNC_POOL_SIZE,
        timeout=REDIS_ASYNC_POOL_WAIT_S,
        **{**redis_connection_options(asynchronous=True), **options},
    )
    return aredis.Redis.from_pool(pool)
