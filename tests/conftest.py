from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.cache import cache

from accounts import ratelimit
from accounts.defaults import create_default_tiers
from accounts.models import Tier
from accounts.services import user_create
from billing.models import TierModelPrice
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME, DEFAULT_DEPLOYMENT_TOOL_FIELDS
from inference.engine.host import EngineState, engine_host_for, engine_hosts
from inference.execution.dispatch import local_backend
from inference.execution.workers import worker_command
from inference.models import ModelDeployment
from inference.selectors import deployment_cache_clear
from tests.parallel import redis_test_url

PASSWORD = "a long enough password 1"
# The scripted engine's pace in the tests (here and in their Celery workers): an answer of its ~60
# tokens takes about 0.6 s, long enough to be stopped mid-stream, short enough not to be waited on.
SCRIPTED_TOKENS_PER_S = 100.0
# The model name the default deployment's answers carry on the scripted engine (`engine_kind_for`).
SCRIPTED_DEFAULT = f"{DEFAULT_DEPLOYMENT_NAME}:scripted"


def pytest_configure(config):
    """Hash the test personas' passwords with a fast hasher, as Django's documentation recommends for
    tests: the production hasher (Argon2id) is slow on purpose, and most tests sign someone in.
    tests/accounts/test_settings.py checks what production uses."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.INFERENCE_SCRIPTED_TOKENS_PER_S = SCRIPTED_TOKENS_PER_S


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
def default_deployment(request):
    """Transactional tests flush the migration's row; put it back for every test that uses the database.
    A rolled-back test's ids are given again to the next test's rows, so the deployments this process
    read by id are forgotten too: a later test's message would otherwise run on an earlier test's
    deployment (an engine of another model loading in the middle of it)."""
    deployment_cache_clear()
    if not ({"db", "transactional_db"} & set(request.fixturenames)) and not request.node.get_closest_marker(
        "django_db"
    ):
        return None
    request.getfixturevalue("transactional_db" if "transactional_db" in request.fixturenames else "db")
    kind = engine_kind_for(request)
    deployment, _ = ModelDeployment.objects.get_or_create(
        name=DEFAULT_DEPLOYMENT_NAME,
        defaults={**DEFAULT_DEPLOYMENT_FIELDS, **DEFAULT_DEPLOYMENT_TOOL_FIELDS, "engine": kind},
    )
    if deployment.engine != kind:
        ModelDeployment.objects.filter(id=deployment.id).update(engine=kind)
        deployment.engine = kind
    create_default_tiers(tier_model=Tier, price_model=TierModelPrice, deployment=deployment)
    staff_groups_restore()
    return deployment


def engine_kind_for(request) -> str:
    """The engine a test's answers come from: the real vLLM engine for a test marked `engine` (what
    vLLM itself decides), else the scripted one (inference/engine/scripted.py), which answers in
    milliseconds without a model, for everything about what surrounds an answer."""
    if request.node.get_closest_marker("engine"):
        return ModelDeployment.Engine.VLLM
    return ModelDeployment.Engine.SCRIPTED


@pytest.fixture(autouse=True)
def deployments_on_the_tests_engine(request, monkeypatch):
    """Every deployment a test creates without naming an engine runs on the test's (`engine_kind_for`),
    as the default deployment does: the row says so, so a Celery worker reads it too."""
    kind = engine_kind_for(request)
    monkeypatch.setattr(ModelDeployment._meta.get_field("engine"), "_get_default", lambda: kind, raising=False)


@pytest.fixture
def draws_the_heaviest(monkeypatch):
    """The weighted draw of a send lands on the heaviest deployment: a test that needs the canary
    drawn first would otherwise miss it now and then (1000 against 100 is one draw in eleven)."""

    class Heaviest:
        @staticmethod
        def choices(population, weights):
            return [population[weights.index(max(weights))]]

    monkeypatch.setattr("orchestration.routing.random", Heaviest)


def staff_groups_restore() -> None:
    """The staff groups the migration creates, put back after a transactional test's flush (the fault
    tests, which run first, flush before any other test has read them)."""
    from django.contrib.auth.models import Group, Permission

    from accounts.defaults import create_staff_groups

    if Group.objects.filter(name="Moderators").exists():
        return
    create_staff_groups(group_model=Group, permission_model=Permission)
    # moderation's own migration adds the review queue's permission to the same group.
    Group.objects.get(name="Moderators").permissions.add(
        Permission.objects.get(content_type__app_label="moderation", codename="review_flag")
    )


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
def short_answers(default_deployment):
    """The free plan's answers cut at 48 tokens, for tests about what happens around an answer (its
    branches, its stream in another tab, a request sent again), not about what it says: each is then
    written in seconds on a slow machine rather than running on to 512. (Tests that use it are
    marked for the database.)"""
    Tier.objects.filter(name="free").update(max_output_tokens=48)


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def mallory(make_user):
    return make_user("mallory")


REDIS_TEST_URL = redis_test_url()


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
    left = [task for task in asyncio.all_tasks() if task is not current]
    for task in left:
        task.cancel()
    if not left:
        return
    _, stuck = await asyncio.wait(left, timeout=LEFTOVER_TASKS_WAIT_S)
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
        engine on a host to the same cores (docs/production.md, "What fault injection found")."""
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


@pytest.fixture(scope="session", autouse=True)
def clean_redis():
    """The production-topology run uses its own Redis database; start it empty."""
    if settings.REDIS_URL:
        import redis

        redis.Redis.from_url(settings.REDIS_URL).flushdb()


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


class DropsLiveSends:
    """A channel layer that loses every group_send, as live delivery may: the publisher has written
    the event to the replay buffer first, but it never arrives live."""

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        return None


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


# Broadcasts a socket may hear at any time: the engine's state, a conversation's title (it comes as
# a first answer ends), a message another socket of the same user sent.
BROADCASTS = ("engine.status", "conversation.title", "conversation.message")


async def next_event(communicator, *, timeout: float = 60, skipping: tuple[str, ...] = BROADCASTS) -> dict[str, Any]:
    """The next event for this socket, skipping the broadcasts (they come at any time)."""
    while True:
        event = await communicator.receive_json_from(timeout=timeout)
        if event["type"] not in skipping:
            return event


async def events_but_broadcasts(communicator, *, timeout: float) -> list[dict[str, Any]]:
    """Every event a socket receives within `timeout` seconds but the broadcasts, which may come at
    any time (a worker starting elsewhere in the run says its engine's state to every socket)."""
    events = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0 and not await communicator.receive_nothing(timeout=left):
        event = await communicator.receive_json_from(timeout=5)
        if event["type"] not in BROADCASTS:
            events.append(event)
    return events


async def drain_until_finished(communicator, *, timeout: float = 60) -> list[dict[str, Any]]:
    """Every event a socket receives until its stream ends (done, error or a refused request)."""
    events = []
    while True:
        event = await next_event(communicator, timeout=timeout)
        events.append(event)
        if event["type"] in ("generation.done", "generation.error", "error"):
            return events


_open_sockets: list[Any] = []


@pytest.fixture(autouse=True)
async def sockets_closed_after_each_test():
    """Closes the sockets a test left open. A consumer left running would go on receiving from the
    channel layer through the tests after it, and its pending receive kept the run from ending."""
    yield
    while _open_sockets:
        communicator = _open_sockets.pop()
        if not communicator.future.done():
            with contextlib.suppress(Exception):
                await communicator.disconnect(timeout=5)


async def open_socket(
    user=None, *, origin: str = "http://localhost", path: str = "/ws/chat/", host: str = "localhost", client=None
):
    """A WebsocketCommunicator through the real ASGI stack (origin check, session auth, routing),
    opened as the page at `host` (http) would open it. With `client` (a test Client signed in
    already) it carries that client's session, else a new session of `user`'s.

    Returns the communicator and whether it connected; a connected one has had its greeting read.
    """
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from chatsite.asgi import application

    headers = [(b"origin", origin.encode())] if origin else []
    if host:
        headers.append((b"host", host.encode()))
    if user is not None and client is None:
        client = Client()
        await database_sync_to_async(client.force_login)(user)
    if client is not None:
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    _open_sockets.append(communicator)  # a refused one too: its consumer runs until told of the close
    connected, _ = await communicator.connect(timeout=30)
    if connected:
        greeting = await communicator.receive_json_from(timeout=30)
        assert greeting["type"] == "engine.status"
    return communicator, connected


async def stopped_while_streaming(attempt: Callable[[], Any], *, tries: int = 3) -> Any:
    """Run `attempt` until its answer was still streaming when it was stopped; returns what it saw.

    `attempt` starts an answer, stops it mid-stream (a stop, a client gone) and returns what it saw
    and whether the answer was still running then. A try whose answer had already ended says nothing
    about stopping: this process may have stood still until the end (the loop-stall warning in the
    log says so). The test asserts on the try that counted.
    """
    ended_first = []
    for _ in range(tries):
        seen, running = await attempt()
        if running:
            return seen
        ended_first.append(seen)
    pytest.fail(f"each answer had ended before it was stopped: {ended_first}")


async def generation_once_finished(user) -> Any:
    """The user's (only) generation once it has ended, or as it stands after 10 s: an answer stopped
    by a client that left ends a moment after the response does."""
    from inference.models import Generation

    for _ in range(100):
        generation = await Generation.objects.filter(user=user).afirst()
        if generation.is_finished:
            break
        await asyncio.sleep(0.1)
    return generation


async def ended_in_the_database_once_queued(user, **row) -> Any:
    """Wait for `user`'s (only) generation to be queued, then end it in the database only, as another
    process or a reaper that could not reach the stream's buffer does: no event announces it."""
    from inference.models import Generation

    for _ in range(200):
        generation = await Generation.objects.filter(user=user).afirst()
        if generation is not None:
            await Generation.objects.filter(id=generation.id).aupdate(**row)
            return generation
        await asyncio.sleep(0.05)
    raise AssertionError("no generation was queued within 10 s")


@pytest.fixture
async def unclaimed_generation(alice, default_deployment):
    """Alice's generation, queued but never dispatched: no engine runs it, a test publishes its events."""
    from inference.models import Generation

    return await Generation.objects.acreate(
        user=alice, deployment=default_deployment, prompt_token_ids=[1], sampling={}
    )


@pytest.fixture
def followers_give_up_at_once(settings, monkeypatch):
    """A follower gives up after half a second without an event, not after an answer's time limit."""
    from inference.streaming import following

    settings.INFERENCE_GENERATION_TIMEOUT_S = 0
    settings.INFERENCE_STREAM_RESYNC_S = 0.1
    monkeypatch.setattr(following, "FOLLOW_GRACE_S", 0.5)


@pytest.fixture
def engine_not_started(monkeypatch):
    """A socket that connects does not start the engine loading: for tests of requests refused
    before any answer, which need no engine and should not spend a CPU on one."""

    async def start() -> None:
        return None

    monkeypatch.setattr(local_backend, "start", start)


def engine_cores(workers: int) -> list[str]:
    """This machine's CPUs shared out among `workers` workers that answer at once, one
    VLLM_CPU_OMP_THREADS_BIND value each ("0" and "1" on two cores; "0,1" and "2,3" on four). With
    fewer CPUs than workers, some share."""
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // workers)
    groups = [cpus[i * share : (i + 1) * share] or [cpus[i % len(cpus)]] for i in range(workers)]
    return [",".join(str(cpu) for cpu in group) for group in groups]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def chat_server(engine):
    """uvicorn serving the real ASGI app on the test session's loop (so it shares the engine)."""
    async with _serving() as url:
        yield url


@pytest.fixture
async def server_without_engine():
    """uvicorn serving the real ASGI app on the test session's loop with no engine started: for
    requests answered or refused before one is needed (limits, validation), and for generations no
    engine runs (tests end them in the database themselves)."""
    async with _serving() as url:
        yield url


@contextlib.asynccontextmanager
async def _serving():
    import uvicorn

    from chatsite.asgi import application

    port = free_port()
    server = uvicorn.Server(
        # As `make run` serves: forwarded headers are the application's to judge (chatsite/proxies.py).
        uvicorn.Config(
            application, host="127.0.0.1", port=port, lifespan="off", log_level="warning", proxy_headers=False
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


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
