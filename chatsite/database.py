"""Database calls from async code: where they run.

channels' `database_sync_to_async` runs every call of a process on one shared thread, so while a
send's transaction waits for its input check or for PostgreSQL, every other socket's send and
every other generation's claim queues behind it: eight messages sent at once came through one
after another, about 30 ms apart, and the last one's answer started a quarter of a second late.

On PostgreSQL, calls run instead in a bounded pool of threads, each holding its own connection
(recycled by `CONN_MAX_AGE`, health-checked), so calls from different sockets and different
generations run side by side. A socket's own calls still run one at a time, in order: a consumer
awaits each handler before the next. SQLite takes one writer at a time anyway, and its embedded
default keeps the one shared thread.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from channels.db import database_sync_to_async
from django.conf import settings

P = ParamSpec("P")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def db_async(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`fn`, a sync function that uses the ORM, as a coroutine function that runs it off the loop."""
    if not database_calls_concurrent():
        return database_sync_to_async(fn)
    return database_sync_to_async(fn, thread_sensitive=False, executor=_executor())


def database_calls_concurrent() -> bool:
    return settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3"


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=settings.DATABASE_ASYNC_THREADS, thread_name_prefix="database")
    return _pool
