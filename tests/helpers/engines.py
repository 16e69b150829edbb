"""The engines behind the tests' answers: the scripted engine or the real vLLM engine in this process
(embedded default), or in a real Celery worker process (production topology), and what each test
leaves generating stopped after it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME, DEFAULT_DEPLOYMENT_TOOL_FIELDS
from inference.engine.host import EngineState, engine_host_for, engine_hosts
from inference.execution.dispatch import local_backend
from inference.execution.workers import worker_command
from inference.models import ModelDeployment
from tests.helpers.servers import free_port

# The scripted engine's pace in the tests (here and in their Celery workers): an answer of its ~60
# tokens takes about 0.6 s, long enough to be stopped mid-stream, short enough not to be waited on.
SCRIPTED_TOKENS_PER_S = 100.0

# The model name the default deployment's answers carry on the scripted engine (`engine_kind_for`).
SCRIPTED_DEFAULT = f"{DEFAULT_DEPLOYMENT_NAME}:scripted"


def pytest_configure(config):
    """The scripted engine writes at the tests' pace in this process, as in their Celery workers (`CeleryWorker`)."""
    settings.INFERENCE_SCRIPTED_TOKENS_PER_S = SCRIPTED_TOKENS_PER_S


def engine_kind_for(request) -> str:
    """The engine a test's answers come from: the real vLLM engine for a test marked `engine` (what
    vLLM itself decides), else the scripted one (inference/engine/scripted.py), which answers in
    milliseconds without a model, for everything about what surrounds an answer."""
    if request.node.get_closest_marker("engine"):
        return ModelDeployment.Engine.VLLM
    return ModelDeployment.Engine.SCRIPTED


class LocalEngine:
    """The embedded default: the engine lives in this process, on the test session's loop."""

    def __init__(self, host) -> None:
        self.host = host
        self.pid = os.getpid()  # the process that hosts the engine

    async def engine_requests(self) -> int:
        return self.host.unfinished_requests()

    async def engine_dtype(self, deployment: str) -> str:
        return engine_hosts()[deployment].dtype


@pytest.fixture
def engine(request):
    """The engine behind a test's answers, started: the real vLLM engine on the default model for a
    test marked `engine`, else the scripted engine (`engine_kind_for`).

    Embedded default: either lives on the session's event loop, which every async test shares, exactly
    as it lives on the server's loop. Production topology (REDIS_URL set): both live in one real Celery
    worker process (`celery_engine_worker`), and every such test goes web → Celery → Redis channel
    layer → socket.
    """
    if settings.INFERENCE_BACKEND == "celery":
        return request.getfixturevalue("celery_engine_worker")
    real = engine_kind_for(request) == ModelDeployment.Engine.VLLM
    return request.getfixturevalue("vllm_engine" if real else "scripted_engine")


@pytest.fixture(scope="session")
async def vllm_engine(django_db_setup, django_db_blocker):
    """The real vLLM engine on the default model in this process, started once for the run (≈40 s
    on a CPU)."""
    host = await _local_engine_ready(django_db_blocker, ModelDeployment.Engine.VLLM)
    yield LocalEngine(host)


@pytest.fixture(scope="session")
async def scripted_engine(django_db_setup, django_db_blocker):
    """The default deployment on the scripted engine in this process (its tokenizer loads in well
    under a second)."""
    host = await _local_engine_ready(django_db_blocker, ModelDeployment.Engine.SCRIPTED)
    yield LocalEngine(host)


async def _local_engine_ready(django_db_blocker, kind: str):
    from chatsite.database import db_async
    from inference.selectors import engine_spec_for

    def spec():
        # Earlier transactional tests may have flushed the migration's row. The row names the engine
        # wanted before the local backend starts, which boots the engine its row names: a scripted
        # test's start would otherwise load vLLM in the background (the migration's row says vllm).
        deployment, _ = ModelDeployment.objects.update_or_create(
            name=DEFAULT_DEPLOYMENT_NAME,
            defaults={"engine": kind},
            create_defaults={**DEFAULT_DEPLOYMENT_FIELDS, **DEFAULT_DEPLOYMENT_TOOL_FIELDS, "engine": kind},
        )
        return engine_spec_for(deployment)

    with django_db_blocker.unblock():
        wanted = await db_async(spec)()
        await local_backend.start()
        host = engine_host_for(wanted)
        await host.wait_ready(timeout=settings.INFERENCE_ENGINE_START_TIMEOUT_S)
    assert host.state is EngineState.READY
    return host


class EngineWorkers:
    """The run's Celery worker for tests that need an engine (`celery_engine_worker`), and the engine
    it hosts ("vllm" or "scripted")."""

    worker: CeleryWorker | None = None
    kind = ""

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.kill()
        self.worker, self.kind = None, ""


@pytest.fixture(scope="session")
def engine_workers(django_db_setup, django_db_blocker, clean_redis):
    workers = EngineWorkers()
    yield workers
    workers.stop()


@pytest.fixture
async def celery_engine_worker(engine_workers, default_deployment):
    """The run's real Celery worker serving the default deployment on the engine its row names
    (`default_deployment`): the tests of one engine follow each other (`pytest_collection_modifyitems`),
    so it is started once for each. It starts after Redis is emptied, which would otherwise drop its
    first heartbeat."""
    kind = default_deployment.engine
    if engine_workers.worker is not None and engine_workers.kind == kind:
        return engine_workers.worker
    engine_workers.stop()
    worker = CeleryWorker(deployments=[settings.INFERENCE_DEFAULT_DEPLOYMENT], name=f"test-gpu-{kind}")
    engine_workers.worker, engine_workers.kind = worker, kind
    await worker.wait_ready()
    return worker


class CeleryWorker:
    """A real `celery worker` process hosting the real engine, against the test database and Redis."""

    def __init__(
        self,
        *,
        deployments: list[str],
        name: str,
        redis_url: str = "",
        queues: list[str] | None = None,
        cores: str = "",
    ) -> None:
        """`cores`: the CPUs its engines compute on (VLLM_CPU_OMP_THREADS_BIND, e.g. "1"). Workers
        that answer at the same time need different ones: vLLM's automatic binding pins every
        engine on a host to the same cores (docs/faults.md, "What fault injection found")."""
        db = settings.DATABASES["default"]
        assert db["ENGINE"] == "django.db.backends.postgresql", "the worker tests need PostgreSQL"
        url = f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        self.node = f"{name}@{socket.gethostname()}"
        # Its own /metrics (observability): its generations' figures are recorded where they run.
        self.metrics_url = f"http://127.0.0.1:{(metrics_port := free_port())}/metrics"
        self.log = open(Path(settings.DATA_DIR) / f"{name}.log", "wb")  # noqa: SIM115 - closed in kill()
        self.process = subprocess.Popen(
            worker_command(queues=queues or [f"gpu.{d}" for d in deployments], node=self.node, concurrency=8),
            env={
                **os.environ,
                "DATABASE_URL": url,
                "REDIS_URL": redis_url or settings.REDIS_URL,
                "CHATSITE_LOCAL_SECRET": "1",
                "METRICS_WORKER_PORT": str(metrics_port),
                # As in this process (`titles_from_first_words`): a title is a generation of its own, which the
                # worker would otherwise ask for after each first answer.
                "CHAT_TITLES_FROM_MODEL": "false",
                "INFERENCE_SCRIPTED_TOKENS_PER_S": str(SCRIPTED_TOKENS_PER_S),
                **worker_tracing_environment(name),
                **({"VLLM_CPU_OMP_THREADS_BIND": cores} if cores else {}),
            },
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
        from inference.execution.dispatch import engine_state

        deadline = time.monotonic() + settings.INFERENCE_ENGINE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the worker exited; see {self.log.name}"
            engines_ready = all(engine_state(d) == "ready" for d in self.deployments)
            if engines_ready and (self.status() or {}).get("moderation") == "ready":
                # Its heap is frozen just after (chatsite/heap.py): wait for that collection's pause
                # here rather than in a test. That it happens at all is a test of its own.
                await self.status_once(lambda status: status.get("heap_frozen_objects"), timeout=30)
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"the worker's engine did not become ready; see {self.log.name}")

    def status(self) -> dict[str, Any] | None:
        from inference.execution.workers import worker_status

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

    async def engine_dtype(self, deployment: str) -> str:
        status = await self.status_once(lambda status: deployment in status.get("dtypes", {}), timeout=5)
        return status.get("dtypes", {}).get(deployment, "")

    def kill(self) -> None:
        """kill -9 the worker and its engine process, as a crash would."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.log.close()


def worker_tracing_environment(name: str) -> dict[str, str]:
    """A worker traces into the session's OTLP receiver (tests/observability/otlp.py), but only the
    work of a request that was itself traced (parent-based, else off): the tracing test's request,
    whose task carries its trace; every other test's work costs it no more than a sampling decision."""
    from tests.observability.otlp import otlp_receiver, tracing_installed

    if not tracing_installed():
        return {}
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver().url,
        "OTEL_SERVICE_NAME": name,
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def engine_cores(workers: int) -> list[str]:
    """This machine's CPUs shared out among `workers` workers that answer at once, one
    VLLM_CPU_OMP_THREADS_BIND value each ("0" and "1" on two cores; "0,1" and "2,3" on four). With
    fewer CPUs than workers, some share."""
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // workers)
    groups = [cpus[i * share : (i + 1) * share] or [cpus[i % len(cpus)]] for i in range(workers)]
    return [",".join(str(cpu) for cpu in group) for group in groups]


@pytest.fixture
def engine_not_started(monkeypatch):
    """A socket that connects does not start the engine loading: for tests of requests refused
    before any answer, which need no engine and should not spend a CPU on one."""

    async def start() -> None:
        return None

    monkeypatch.setattr(local_backend, "start", start)


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
