from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from chatsite import database
from chatsite.database import database_calls_concurrent, db_async

pytestmark = [pytest.mark.topology, pytest.mark.django_db(transaction=True)]


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


async def test_database_calls_from_async_code_run_side_by_side_on_postgresql():
    """One call waits for the other to run: on a single shared thread it would wait in vain."""
    if not database_calls_concurrent():
        pytest.skip("SQLite takes one writer at a time: its calls take turns (the test below)")
    second_ran = threading.Event()

    def first() -> tuple[int, bool]:
        return _backend_pid(), second_ran.wait(timeout=5)

    def second() -> int:
        pid = _backend_pid()
        second_ran.set()
        return pid

    (first_pid, saw_second), second_pid = await asyncio.gather(db_async(first)(), db_async(second)())
    assert saw_second
    assert first_pid != second_pid  # each thread has its own connection


async def test_database_calls_from_async_code_take_turns_on_one_thread_on_sqlite():
    if database_calls_concurrent():
        pytest.skip("PostgreSQL runs them side by side (the test above)")
    threads = await asyncio.gather(*(db_async(threading.get_ident)() for _ in range(4)))
    assert len(set(threads)) == 1


async def test_calls_in_quick_succession_do_not_each_check_the_connection_first(monkeypatch):
    """Django's health check is a round trip of its own; channels asked for one before every call."""
    if not database_calls_concurrent():
        pytest.skip("SQLite's calls go through channels' own thread, unchanged")
    from django.db.backends.postgresql.base import DatabaseWrapper

    checks = []
    is_usable = DatabaseWrapper.is_usable

    def counted(self) -> bool:
        checks.append(self)
        return is_usable(self)

    monkeypatch.setattr(DatabaseWrapper, "is_usable", counted)
    monkeypatch.setattr(database, "CONNECTION_CHECK_INTERVAL_S", 60)
    for _ in range(10):
        await db_async(_backend_pid)()
    # At most one per database thread in the pool, not one per call.
    assert len(checks) <= settings.DATABASE_ASYNC_THREADS


async def test_a_connection_postgresql_dropped_is_replaced_on_a_later_call(monkeypatch):
    if not database_calls_concurrent():
        pytest.skip("SQLite has no server to drop a connection")
    monkeypatch.setattr(database, "CONNECTION_CHECK_INTERVAL_S", 0.05)
    monkeypatch.setattr(settings, "DATABASE_ASYNC_THREADS", 1)
    monkeypatch.setattr(database, "_pool", None)  # one thread, so every call meets the same connection
    first = await db_async(_backend_pid)()
    await sync_to_async(_terminate)(first)
    await asyncio.sleep(0.1)
    second = await db_async(_backend_pid)()
    assert second != first


def _terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
