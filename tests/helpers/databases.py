"""The database and Redis in a test: what a transactional test's flush puts back, its rate limits
emptied, Redis of its own where it needs the server, a schema migrated back to the latest, and helpers
for races and dropped connections."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache

from accounts import ratelimit
from tests.parallel import redis_test_url

REDIS_TEST_URL = redis_test_url()

# The post_migrate receivers whose rows a flush puts back from a copy (`post_migrate_rows_restored`).
PERMISSIONS_RECEIVER = "django.contrib.auth.management.create_permissions"


def pytest_configure(config):
    from django.core.management.commands import flush

    flush.emit_post_migrate_signal = post_migrate_rows_restored(flush.emit_post_migrate_signal)


def post_migrate_rows_restored(emit: Callable[..., None]) -> Callable[..., None]:
    """The post_migrate signal a transactional test's flush sends, made cheap.

    After emptying every table, the flush sends post_migrate as a migration does, and Django's content
    types and permissions are worked out again app by app: about half a second, after each of hundreds
    of tests. Here the first flush of a database sends it as usual and keeps a copy of those rows;
    every later one puts the same rows back (with the same ids) and sends the signal to the other
    receivers only.
    """
    copies: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}

    def emit_after_flush(verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
        from django.contrib.auth.management import create_permissions
        from django.contrib.auth.models import Permission
        from django.contrib.contenttypes.management import create_contenttypes
        from django.contrib.contenttypes.models import ContentType
        from django.db.models.signals import post_migrate

        if db not in copies:
            emit(verbosity, interactive, db, **kwargs)
            copies[db] = (
                list(ContentType.objects.using(db).order_by("id").values()),
                list(Permission.objects.using(db).order_by("id").values()),
            )
            return
        content_types, permissions = copies[db]
        ContentType.objects.using(db).bulk_create([ContentType(**row) for row in content_types])
        Permission.objects.using(db).bulk_create([Permission(**row) for row in permissions])
        ContentType.objects.clear_cache()  # as the receiver does: a migration in between may have cached others
        post_migrate.disconnect(create_contenttypes)
        post_migrate.disconnect(dispatch_uid=PERMISSIONS_RECEIVER)
        try:
            emit(verbosity, interactive, db, **kwargs)
        finally:
            post_migrate.connect(create_contenttypes)
            post_migrate.connect(create_permissions, dispatch_uid=PERMISSIONS_RECEIVER)

    return emit_after_flush


@pytest.fixture
def redis_url(settings):
    """The real Redis server, database 2 only (rate limits, the cache), emptied before and after."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip(f"Redis is not running at {REDIS_TEST_URL}")
    client.flushdb()
    settings.REDIS_URL = REDIS_TEST_URL
    yield REDIS_TEST_URL
    client.flushdb()


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    """One test's requests must not count against the next's."""
    rate_limits_clear()
    yield
    rate_limits_clear()


def rate_limits_clear() -> None:
    """Empty the cache and every rate-limit bucket: in the cache (embedded default), or under their
    own prefix in Redis, where clearing the cache leaves them (chatsite/cache.py)."""
    cache.clear()
    if settings.REDIS_URL:
        import redis

        from chatsite.cache import keys_delete

        keys_delete(redis.Redis.from_url(settings.REDIS_URL), prefix=ratelimit.KEY_PREFIX)


@pytest.fixture
def latest_schema_after():
    """For a test that migrates the database back to test a migration: migrating an app back also
    undoes the other apps' migrations that depend on the ones undone, so afterwards every app is
    migrated to its latest again, as the tests after it expect."""
    yield
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def at_the_same_instant(call: Callable[[], Any], *, times: int) -> list[Any]:
    """Run `call` in `times` threads released together (a race on the database), each closing its own
    connections when done. Returns their results; the first failure is raised."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    start = threading.Barrier(times)

    def run(_):
        start.wait(timeout=5)
        try:
            return call()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=times) as pool:
        return list(pool.map(run, range(times)))


@pytest.fixture
def one_database_thread(monkeypatch):
    """Async code's database calls on one thread that does not check its connection between calls
    (as within CONNECTION_CHECK_INTERVAL_S of its last check): each call meets the connection the
    last one left, so `database_connection_dropped` breaks the next one."""
    from chatsite import database

    if not database.database_calls_concurrent():
        pytest.skip("SQLite has no server to drop a connection")
    monkeypatch.setattr(database, "CONNECTION_CHECK_INTERVAL_S", 60)
    monkeypatch.setattr(settings, "DATABASE_ASYNC_THREADS", 1)
    monkeypatch.setattr(database, "_pool", None)


async def database_connection_dropped() -> None:
    """PostgreSQL ends the connection of async code's database thread (`one_database_thread`), as a
    restart or a failover would."""
    from asgiref.sync import sync_to_async

    from chatsite.database import db_async

    pid = await db_async(_backend_pid)()
    await sync_to_async(_backend_terminate)(pid)


def _backend_pid() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _backend_terminate(pid: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid = %s",
            [pid],
        )
