"""What every test of the suite shares: the run's policies (a fast password hasher, titles and
summaries off), and the order and pytest-xdist groups of the tests.

The fixtures and helpers live in tests/helpers/, a module per subject, loaded here as plugins:

- `deployments`: the default deployment on the test's engine, plans and staff groups;
- `factories`: the people (alice, bob, mallory, `PASSWORD`) and rows made for a test;
- `databases`: rate limits, Redis of a test's own, races and dropped connections;
- `engines`: the scripted and real engines, in this process or in a real Celery worker;
- `sockets`: the chat socket through the real ASGI stack, and reading its events;
- `servers`: the ASGI app served by uvicorn, for the official clients and the browser;
- `session`: what the run readies at its start and ends at its exit, and its loop's stalls;
- `identity`: a real OpenID Connect provider on loopback, for signing in through one.

Tests import helpers from their modules (`from tests.helpers.sockets import open_socket`).
"""

from __future__ import annotations

import pytest
from django.conf import settings

# In this order: pytest sets up the autouse fixtures of one scope plugin by plugin, in the order
# they are named here, and a module's in the order of their names; this conftest's come after all of them.
pytest_plugins = [
    "tests.helpers.deployments",
    "tests.helpers.databases",
    "tests.helpers.engines",
    "tests.helpers.sockets",
    "tests.helpers.servers",
    "tests.helpers.factories",
    "tests.helpers.session",
    "tests.helpers.identity",
]
# Their asserts are rewritten as a conftest's are, even in a module another of them imports first.
pytest.register_assert_rewrite(*pytest_plugins)


def pytest_configure(config):
    """Hash the test personas' passwords with a fast hasher, as Django's documentation recommends for
    tests: the production hasher (Argon2id) is slow on purpose, and most tests sign someone in.
    tests/accounts/test_settings.py checks what production uses."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups set here
def pytest_collection_modifyitems(config, items):
    """Mark `topology` every test marked `redis` or `fault`; run the fault tests first (they stop the
    run's worker, whose reaper would take their workers' answers for orphans), then the real engine's,
    then the rest, so that the run's worker changes engine once at most (`celery_engine_worker`); and
    group them for pytest-xdist.

    `make test` runs every test in the embedded default, then only those marked `topology` on
    PostgreSQL, Redis and Celery workers: the tests whose outcome these could change, each marked
    where it is written, so that the second run repeats none that prove nothing new there."""
    for item in items:
        if item.get_closest_marker("redis") or item.get_closest_marker("fault"):
            item.add_marker(pytest.mark.topology)
        if "engine" in getattr(item, "fixturenames", ()) and settings.INFERENCE_BACKEND == "local":
            # The engine `engine` picks, started first: once a test's database transaction has written,
            # SQLite's file is locked against the start's own write (its process heartbeat).
            real = item.get_closest_marker("engine") is not None
            item.fixturenames.insert(0, "vllm_engine" if real else "scripted_engine")
        if item.get_closest_marker("fault"):
            # Under pytest-xdist, in one process, before anything there starts the run's worker.
            item.add_marker(pytest.mark.xdist_group("faults"))
        elif item.get_closest_marker("engine"):
            # Under pytest-xdist, the real engine's tests run in one process, which alone loads it.
            item.add_marker(pytest.mark.xdist_group("vllm"))
    items.sort(key=lambda item: (item.get_closest_marker("fault") is None, item.get_closest_marker("engine") is None))


@pytest.fixture(autouse=True)
def titles_from_first_words(settings):
    """Titles from the first message's words, not from the model, except in the tests of titles
    (tests/conversations/test_titles.py): a title is a generation of its own, which would change
    what other tests count of generations and of the engine's work."""
    settings.CHAT_TITLES_FROM_MODEL = False


@pytest.fixture(autouse=True)
def summaries_off(settings):
    """No summaries of long conversations, except in the tests of memory (tests/orchestration): a
    summary is a generation of its own, which would change what other tests count."""
    settings.CHAT_SUMMARIES = False
