from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.cache import cache

from accounts import ratelimit
from accounts.defaults import create_default_tiers
from accounts.models import Tier, TierModelPrice
from accounts.services import user_create
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME
from inference.dispatch import local_backend
from inference.engine import EngineState, engine_hosts
from inference.models import ModelDeployment

PASSWORD = "a long enough password 1"


@pytest.fixture(autouse=True)
def default_deployment(request):
    """Transactional tests flush the migration's row; put it back for every test that uses the database."""
    if not ({"db", "transactional_db"} & set(request.fixturenames)) and not request.node.get_closest_marker(
        "django_db"
    ):
        return None
    request.getfixturevalue("transactional_db" if "transactional_db" in request.fixturenames else "db")
    deployment, _ = ModelDeployment.objects.get_or_create(
        name=DEFAULT_DEPLOYMENT_NAME, defaults=DEFAULT_DEPLOYMENT_FIELDS
    )
    create_default_tiers(tier_model=Tier, price_model=TierModelPrice, deployment=deployment)
    return deployment


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
def make_user(db):
    def make(username: str) -> Any:
        return user_create(username=username, password=PASSWORD, email=f"{username}@example.com")

    return make


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def mallory(make_user):
    return make_user("mallory")


REDIS_TEST_URL = "redis://127.0.0.1:6379/2"


@pytest.fixture
def redis_url(settings):
    """The real Redis server, database 2 only (rate limits, the cache), emptied before and after."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("Redis is not running at 127.0.0.1:6379")
    client.flushdb()
    settings.REDIS_URL = REDIS_TEST_URL
    yield REDIS_TEST_URL
    client.flushdb()


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


class LocalEngine:
    """The embedded default: the engine lives in this process, on the test session's loop."""

    def __init__(self, host) -> None:
        self.host = host
        self.pid = os.getpid()  # the process that hosts the engine

    async def engine_requests(self) -> int:
        return self.host.unfinished_requests()


@pytest.fixture(scope="session")
async def engine(django_db_setup, django_db_blocker, clean_redis):
    """The real vLLM engine on the default model, started once for the whole run (≈40 s on a CPU).

    Embedded default: it lives on the session's event loop, which every async test shares, exactly as
    it lives on the server's loop. Production topology (REDIS_URL set): it lives in a real Celery
    worker process, and every engine test goes web → Celery → Redis channel layer → socket. It starts
    after Redis is emptied, which would otherwise drop its worker's first heartbeat.
    """
    with django_db_blocker.unblock():
        # Earlier transactional tests may have flushed the migration's row.
        await ModelDeployment.objects.aget_or_create(name=DEFAULT_DEPLOYMENT_NAME, defaults=DEFAULT_DEPLOYMENT_FIELDS)
        if settings.INFERENCE_BACKEND == "celery":
            worker = CeleryWorker(deployments=[settings.INFERENCE_DEFAULT_DEPLOYMENT], name="test-gpu")
            try:
                await worker.wait_ready()
                yield worker
            finally:
                worker.kill()
            return
        await local_backend.start()
        host = engine_hosts()[settings.INFERENCE_DEFAULT_DEPLOYMENT]
        await host.wait_ready(timeout=settings.INFERENCE_ENGINE_START_TIMEOUT_S)
        assert host.state is EngineState.READY
        yield LocalEngine(host)


class CeleryWorker:
    """A real `celery worker` process hosting the real engine, against the test database and Redis."""

    def __init__(self, *, deployments: list[str], name: str) -> None:
        db = settings.DATABASES["default"]
        assert db["ENGINE"] == "django.db.backends.postgresql", "the worker tests need PostgreSQL"
        url = f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        self.node = f"{name}@{socket.gethostname()}"
        queues = ",".join(f"gpu.{d}" for d in deployments)
        self.log = open(Path(settings.DATA_DIR) / f"{name}.log", "wb")  # noqa: SIM115 - closed in kill()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "chatsite",
                "worker",
                "-P",
                "threads",
                "-c",
                "8",
                "-Q",
                queues,
                "-n",
                self.node,
                "--without-gossip",
                "--without-mingle",
                "-l",
                "INFO",
            ],
            env={**os.environ, "DATABASE_URL": url, "CHATSITE_LOCAL_SECRET": "1"},
            cwd=settings.BASE_DIR,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.process.pid  # the process that hosts the engine
        self.deployments = deployments

    async def wait_ready(self) -> None:
        """Its engines are up and its moderation classifiers loaded. Until they are, a stream's
        first sentence waits for them while the engine writes on, and then the whole backlog is
        published in a rush: a test that stops an answer after its first deltas finds it ended."""
        from inference.workers import worker_engine_state

        deadline = time.monotonic() + settings.INFERENCE_ENGINE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the worker exited; see {self.log.name}"
            engines_ready = all(worker_engine_state(d) == "ready" for d in self.deployments)
            if engines_ready and (self.status() or {}).get("moderation") == "ready":
                # Its heap is frozen just after (chatsite/heap.py): wait for that collection's pause
                # here rather than in a test. That it happens at all is a test of its own.
                await self.status_once(lambda status: status.get("heap_frozen_objects"), timeout=30)
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"the worker's engine did not become ready; see {self.log.name}")

    def status(self) -> dict[str, Any] | None:
        from inference.workers import worker_status

        return worker_status(f"{self.node}:{self.process.pid}")

    async def status_once(self, holds: Callable[[dict[str, Any]], Any], *, timeout: float) -> dict[str, Any]:
        """Its heartbeat's status as soon as `holds` is true of it, or the last one seen after `timeout`
        seconds ({} while it has none)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status() or {}
            if holds(status) or time.monotonic() >= deadline:
                return status
            await asyncio.sleep(0.5)

    async def engine_requests(self) -> int:
        await asyncio.sleep(1.2)  # one heartbeat
        return self.status()["engine_requests"]

    def kill(self) -> None:
        """kill -9 the worker and its engine process, as a crash would."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.log.close()


@pytest.fixture(autouse=True)
def quiet_engine_after_each_test(request):
    """Stop what a test left generating, so it neither outlives the test nor collides with the flush.

    Tests that send messages without waiting for the answers leave generations running in the shared
    engine. In the production topology the worker finishes them, and one finishing during the flush
    would deadlock with it: stop them and wait. In the embedded default the engine's loop only runs
    inside async tests, so request the stops and let the next test's loop carry them out.
    """
    transactional = "transactional_db" in request.fixturenames or _is_transactional(request)
    if not transactional:
        yield
        return
    # Set the database up first, so its flush runs after this fixture's teardown (finalizers unwind).
    request.getfixturevalue("_django_db_helper")
    yield
    from inference.models import Generation
    from inference.services import generation_request_stop

    deadline = time.monotonic() + 30
    while True:
        unfinished = list(Generation.objects.filter(status__in=["queued", "running"]))
        for generation in unfinished:
            generation_request_stop(generation=generation)
        if not unfinished or settings.INFERENCE_BACKEND != "celery" or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _is_transactional(request) -> bool:
    marker = request.node.get_closest_marker("django_db")
    return bool(marker and marker.kwargs.get("transaction"))


@pytest.fixture(scope="session", autouse=True)
def clean_redis():
    """The production-topology run uses its own Redis database; start it empty."""
    if settings.REDIS_URL:
        import redis

        redis.Redis.from_url(settings.REDIS_URL).flushdb()


class DropsLiveSends:
    """A channel layer that loses every group_send, as live delivery may: the publisher has written
    the event to the replay buffer first, but it never arrives live."""

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        return None


async def next_event(communicator, *, timeout: float = 60) -> dict[str, Any]:
    """The next event for this socket, skipping engine status broadcasts (they come at any time)."""
    while True:
        event = await communicator.receive_json_from(timeout=timeout)
        if event["type"] != "engine.status":
            return event


async def drain_until_finished(communicator, *, timeout: float = 60) -> list[dict[str, Any]]:
    """Every event a socket receives until its stream ends (done, error or a refused request)."""
    events = []
    while True:
        event = await next_event(communicator, timeout=timeout)
        events.append(event)
        if event["type"] in ("generation.done", "generation.error", "error"):
            return events


async def open_socket(user=None, *, origin: str = "http://localhost", path: str = "/ws/chat/"):
    """A WebsocketCommunicator through the real ASGI stack (origin check, session auth, routing).

    Returns the communicator and whether it connected; a connected one has had its greeting read.
    """
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from chatsite.asgi import application

    headers = [(b"origin", origin.encode())] if origin else []
    if user is not None:
        client = Client()
        await database_sync_to_async(client.force_login)(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    if connected:
        greeting = await communicator.receive_json_from(timeout=10)
        assert greeting["type"] == "engine.status"
    return communicator, connected


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def chat_server(engine):
    """uvicorn serving the real ASGI app on the test session's loop (so it shares the engine)."""
    import uvicorn

    from chatsite.asgi import application

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(application, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task
