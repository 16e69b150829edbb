"""The suite under pytest-xdist (`make test` runs two processes): what each process must have of its own.

Loaded before Django reads its settings (`-p tests.parallel` in pyproject.toml's addopts). pytest-django
gives each process a test database of its own; here each gets Redis databases of its own too, as the
channel layer, cache, broker and limits of one process must not meet another's (a flush at start-up, a
cleared cache). Process gwN uses databases 1 + 2N (REDIS_URL's, where it names 1) and 2 + 2N
(`redis_test_url`), so two processes use 1 to 4. TEST_REDIS_SERVER names another Redis server for the
latter (by default the one on 127.0.0.1:6379), so that two runs side by side need not share one.
"""

from __future__ import annotations

import os


def worker_index() -> int:
    """0 for the first pytest-xdist process or a run without it, 1 for the second, ..."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def redis_test_url() -> str:
    """The Redis database of the tests that need the server but not the topology (`redis_url`)."""
    server = os.environ.get("TEST_REDIS_SERVER", "redis://127.0.0.1:6379").rstrip("/")
    return f"{server}/{2 + 2 * worker_index()}"


def _own_redis_database() -> None:
    url = os.environ.get("REDIS_URL", "")
    base, _, database = url.rpartition("/")
    if worker_index() and base and database.isdigit():
        os.environ["REDIS_URL"] = f"{base}/{int(database) + 2 * worker_index()}"


_own_redis_database()
