"""Database calls from async code: where they run.

channels' `database_sync_to_async` runs every call of a process on one shared thread, so while a
send's transaction waits for its input check or for PostgreSQL, every other socket's send and
every other generation's claim queues behind it: eight messages sent at once came through one
after another, about 30 ms apart, and the last one's answer started a quarter of a second late.

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
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")

CONNECTION_CHECK_INTERVAL_S = 1.0

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_thread = threading.local()


def db_async(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`fn`, a sync function that uses the ORM, as a coroutine function that runs it off the loop."""
    if not database_calls_concurrent():
        return database_sync_to_async(fn)
    return sync_to_async(_with_connection_checks(fn), thread_sensitive=False, executor=_executor())


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
