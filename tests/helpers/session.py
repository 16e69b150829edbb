"""The test session as a whole: what it readies once at its start (an empty Redis, moderation's model)
and ends at its exit (the engines, the tasks left on its loop, the connections to the test database),
and its event loop's stalls, reported as they happen with what each thread was doing.

Its fixtures are all in this one module because pytest sets up a module's autouse fixtures of one
scope in the order of their names and tears them down in reverse: `tasks_ended_at_exit`, last by
name, ends the tasks left on the loop before the others are torn down."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
import warnings

import pytest
from django.conf import settings

from inference.engine.host import engine_hosts


@pytest.fixture(scope="session", autouse=True)
def clean_redis():
    """The production-topology run uses its own Redis database; start it empty."""
    if settings.REDIS_URL:
        import redis

        redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.fixture(scope="session", autouse=True)
def moderation_classifiers_loaded():
    """Every message goes through input moderation; load its embedding model once, up front (≈6 s),
    so no test's timeout has to absorb it."""
    from moderation.classifiers import warm_up

    warm_up()


@pytest.fixture(scope="session", autouse=True)
async def engines_shut_down_at_exit():
    """A socket test may have started the engine loading; stop its process so the run can exit."""
    yield
    for host in engine_hosts().values():
        await host.aclose()


@pytest.fixture(scope="session", autouse=True)
def no_connections_left_to_the_test_database(django_db_setup, django_db_blocker):
    """End the run with nobody connected to the test database, so it can be dropped.

    The database threads of this process (chatsite/database.py) each keep a connection open, and a
    worker process killed with -9 leaves its backends to PostgreSQL to notice: either would make the
    database's removal fail with "being accessed by other users". Set up before the session's other
    fixtures, this is torn down after them (the worker already killed), before the database goes.
    """
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        # From PostgreSQL 14 it can wait (here up to 5 s) for each backend to be gone.
        wait = ", 5000" if connection.pg_version >= 140000 else ""
        cursor.execute(
            f"SELECT pg_terminate_backend(pid{wait}) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    connection.close()


LEFTOVER_TASKS_WAIT_S = 20


@pytest.fixture(scope="session", autouse=True)
async def tasks_ended_at_exit():
    """Ends the tasks the run left on its loop, before the loop closes, and says which would not end.

    The loop's close cancels what is left and waits for all of it without a limit, so one task
    that will not end would hang the run after its last test. Here each gets LEFTOVER_TASKS_WAIT_S
    to end once cancelled; one that still has not is reported with where it waits (a warning in the
    run's summary) and taken off the loop's list, so the run ends and says why.
    """
    yield
    current = asyncio.current_task()
    stuck = {task for task in asyncio.all_tasks() if task is not current}
    # Cancelled again until it ends: on Python 3.11 a cancellation that lands as an `asyncio.timeout`
    # inside the task expires is lost, and a task that polls with one (channels_redis' pub/sub
    # receiver) then polls on, where a second cancellation ends it at once.
    deadline = time.monotonic() + LEFTOVER_TASKS_WAIT_S
    while stuck and time.monotonic() < deadline:
        for task in stuck:
            task.cancel()
        _, stuck = await asyncio.wait(stuck, timeout=0.5)
    for task in stuck:
        warnings.warn(f"a task would not end when cancelled: {task!r}\n{_await_chain(task)}", stacklevel=1)
        # The loop's close would wait for it for ever; asyncio has no public way to let go of a task.
        asyncio.tasks._unregister_task(task)


def _await_chain(task: asyncio.Task) -> str:
    """Where a task waits: each coroutine down its chain of awaits, then what the last one awaits."""
    lines, awaited = [], task.get_coro()
    while (frame := getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)) is not None:
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    lines.append(f"  awaiting {awaited!r}")
    return "\n".join(lines)


STALL_REPORT_S = 1.0

stall_log = logging.getLogger("tests.loop_stalls")


@pytest.fixture(scope="session", autouse=True)
async def loop_stalls_reported():
    """Logs a warning whenever the test loop runs nothing for STALL_REPORT_S while a test is on it,
    with what each thread of the process is doing, the CPU the process used meanwhile, the CPU time
    the hypervisor took from this virtual machine meanwhile (steal) and the machine's load: a test
    that fails on timing then says whether this process stood still, and whether it was busy or
    starved (the warning is in the test's captured log)."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    last_turn = [time.monotonic()]  # when the loop last ran a callback of the watcher's
    done = threading.Event()

    def turn() -> None:
        last_turn[0] = time.monotonic()

    def watch() -> None:
        # The last turn the watcher saw, and the process's CPU and the stolen time when it saw it.
        seen = (last_turn[0], time.process_time(), stolen_s())
        stalled_since = None
        while not done.wait(0.1):
            if not loop.is_running():  # between tests: sync fixtures run with the loop stopped
                last_turn[0], stalled_since = time.monotonic(), None
            elif last_turn[0] == seen[0]:
                quiet = time.monotonic() - seen[0]
                if quiet >= STALL_REPORT_S and stalled_since is None:
                    stalled_since = seen[0]
                    stall_log.warning(
                        "the test loop has run nothing for %.1f s; this process used %.2f s of CPU meanwhile, "
                        "the hypervisor took %.2f s of CPU time from this machine, "
                        "the machine's load average is %.1f; its threads are at:\n%s",
                        quiet,
                        time.process_time() - seen[1],
                        stolen_s() - seen[2],
                        os.getloadavg()[0],
                        threads_now(),
                    )
            if last_turn[0] != seen[0]:
                if stalled_since is not None:
                    stall_log.warning("the test loop stood still for %.1f s", last_turn[0] - stalled_since)
                    stalled_since = None
                seen = (last_turn[0], time.process_time(), stolen_s())
            loop.call_soon_threadsafe(turn)

    def threads_now() -> str:
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        return "\n".join(
            f"-- {names.get(ident, ident)}{' (the loop)' if ident == loop_thread else ''}:\n"
            + "".join(traceback.format_stack(frame)[-6:])
            for ident, frame in sys._current_frames().items()
            if ident != threading.get_ident()
        )

    watcher = threading.Thread(target=watch, name="loop-stall-watch", daemon=True)
    watcher.start()
    yield
    done.set()


def stolen_s() -> float:
    """CPU time the hypervisor has given to others while this machine's CPUs wanted to run, summed
    over CPUs, since boot (the `steal` column of /proc/stat); 0 where there is no such column."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0
