from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connection

from chatsite.database import database_calls_concurrent, db_async

pytestmark = pytest.mark.django_db(transaction=True)


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
