"""Database calls from async code: where they run.

channels' `database_sync_to_async` runs every call of a process on one shared thread, so while a
send's transaction waits for PostgreSQL, every other socket's send and every other generation's
claim queues behind it: messages sent together would be served one after another.

On PostgreSQL, calls run instead in a bounded pool of threads, each holding its own connection,
so calls from different sockets and different generations run side by side. A socket's own calls
still run one at a time, in order: a consumer awaits each handler before the next. SQLite takes
one writer at a time anyway, and its embedded default keeps the one shared thread.

channels checks a thread's connections before every call (`close_old_connections`), and with
`CONN_HEALTH_CHECKS` that makes the call's first query wait for a `SELECT 1` of its own: a round
trip on the way of every message to its first token. Here a thread's connection is checked (closed
when older than `CONN_MAX_AGE`, health-checked) at most once every `CONNECTION_CHECK_INTERVAL_S`,
and at once after a call that failed, so a connection PostgreSQL dropped costs at most the calls
of that second on that thread.

Such a call fails: a connection that PostgreSQL dropped (a restart, a failover, an idle timeout)
is found broken only by the query that uses it. Calls that must not be lost to that (a generation's
claim and its end, which nothing else would record) go through `reconnecting`, which runs them
again on a fresh connection; only calls that are safe to repeat may.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, Protocol, TypeVar

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

CONNECTION_CHECK_INTERVAL_S = 1.0
# How often `reconnecting` runs a call again after its connection failed, and how long it waits
# before each try (growing: the database may be restarting).
RECONNECT_TRIES = 3
RECONNECT_BACKOFF_S = 0.1


class DatabaseCall(Protocol):
    """How async code reaches the database from its loop: `db_async`, `sync_to_async` (in Django's
    request cycle, which manages the thread's connection), or a `reconnecting` wrapper of either."""

    def __call__(self, fn: Callable[P, R], /) -> Callable[P, Awaitable[R]]: ...


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_thread = threading.local()


def db_async(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`fn`, a sync function that uses the ORM, as a coroutine function that runs it off the loop."""
    if not database_calls_concurrent():
        return database_sync_to_async(fn)
    return sync_to_async(_with_connection_checks(fn), thread_sensitive=False, executor=_executor())


def reconnecting(fn: Callable[P, R], **retry_kwargs: object) -> Callable[P, R]:
    """`fn`, run again on a fresh connection when its connection fails (OperationalError or
    InterfaceError), up to RECONNECT_TRIES times in all, with a short growing wait before each
    retry. Only for a call that is safe to repeat (a conditional update, an idempotent write) and
    is not inside a caller's transaction, whose work the broken connection has lost.

    `retry_kwargs` are added to a retry's arguments: a retry may find the first try's work done
    (the connection broke after the commit, before the reply) and must then recognise it as its own.
    """

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(1, RECONNECT_TRIES + 1):
            try:
                if attempt == 1:
                    return fn(*args, **kwargs)
                return fn(*args, **{**kwargs, **retry_kwargs})  # type: ignore[arg-type]  # the retry's own keywords
            except (OperationalError, InterfaceError) as exc:
                if attempt == RECONNECT_TRIES or connection.in_atomic_block:
                    raise
                logger.warning("%s: database connection failed (%s); retrying on a new one", fn.__name__, exc)
                try:
                    connection.close()
                except Exception:  # a connection that broke may fail to close too: it is dropped anyway
                    connection.connection = None
                time.sleep(RECONNECT_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    return call


def _with_connection_checks(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        now = time.monotonic()
        if now - getattr(_thread, "checked_at", float("-inf")) >= CONNECTION_CHECK_INTERVAL_S:
            close_old_connections()
            _thread.checked_at = now
        try:
            return fn(*args, **kwargs)
        except BaseException:
            close_old_connections()  # a broken connection is dropped now, not a second later
            raise

    return call


def database_calls_concurrent() -> bool:
    return settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3"


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=settings.DATABASE_ASYNC_THREADS, thread_name_prefix="database")
    return _pool
