"""GPU workers: the engine runtime inside a Celery worker, and what the web side knows of workers.

A worker process owns one event loop in a daemon thread. On it live the engine hosts (one vLLM
AsyncLLM per deployment the worker consumes), the runner, a heartbeat, an abort listener and the
reaper. Once the engines and the classifiers have loaded, the start-up heap is frozen out of the
garbage collector's sight (chatsite/heap.py). Celery's threads each block on one generation's
future while the loop interleaves them all in the one engine, so concurrent tasks batch together.

Liveness: every second a worker refreshes `chatsite:worker:<name>` (expiring after
INFERENCE_WORKER_HEARTBEAT_TTL_S) and its engines' states. The reaper, run by every worker and every
web process, ends generations still `running` on a worker whose heartbeat has expired, and tells the
client, so a worker killed mid-answer never leaves a message pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
import weakref
from typing import Any

import uvloop
from django.conf import settings

from chatsite.database import db_async, reconnecting
from chatsite.heap import heap_freeze_when_warm, heap_frozen_count
from chatsite.redis_clients import redis_async_client, redis_client
from inference.engine.host import EngineState, engine_host_for, engine_hosts
from inference.engine.tokenizers import count_tokens, tokenizer_for
from inference.execution.runner import Runner
from inference.models import Generation
from inference.selectors import deployment_get, engine_spec_for, generation_ids_stop_requested
from inference.services import generation_finish, generation_promote_waiting, generations_redispatch_queued
from inference.streaming.streams import StreamPublisher, engine_status_broadcast
from moderation.services import classifiers_loaded, classifiers_prepare

logger = logging.getLogger(__name__)

ABORT_CHANNEL = "chatsite:abort"
# A held answer's message passed input moderation: the runner holding its text shows it.
RELEASE_CHANNEL = "chatsite:release"
ABORT_LISTENER_NAME = "chatsite-abort-listener"  # its Redis connection's name (CLIENT LIST)
ABORT_LISTENER_RETRY_MAX_S = 2.0  # the longest wait between its attempts to reconnect
WORKER_KEY = "chatsite:worker:{name}"
ENGINE_STATE_KEY = "chatsite:engine:{deployment}:{state}"  # sorted set: worker -> last seen


def process_warm() -> bool:
    """The classifiers are loaded and no engine this process hosts is still loading: start-up is
    over, and the heap can be frozen (chatsite.heap)."""

    return classifiers_loaded() and all(host.state is not EngineState.LOADING for host in engine_hosts().values())


def _deployments_from_queues(queues: list[str]) -> list[str]:
    names = [q.split(".", 1)[1].split(".")[0] for q in queues if q.startswith("gpu.")]
    return names or list(settings.INFERENCE_LOCAL_DEPLOYMENTS)


class WorkerRuntime:
    def __init__(self, *, name: str, deployments: list[str]) -> None:
        self.name = name
        self.deployments = deployments
        # uvloop, as a web process's uvicorn runs: the loop's own work per wake-up (timers, callbacks,
        # the selector) is C, where asyncio's is Python, and every relayed event wakes it.
        self.loop = uvloop.new_event_loop()
        self.runner: Runner | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="engine-loop", daemon=True)
        self._tasks: list[asyncio.Task] = []
        self._boot_error: BaseException | None = None

    def start(self) -> None:
        """Start the loop thread and begin loading; raises if the worker cannot serve its deployments."""
        self._thread.start()
        if not self._started.wait(timeout=120):
            raise RuntimeError("the engine loop did not start within 120 s")
        if self._boot_error is not None:
            raise RuntimeError(f"the worker cannot start: {self._boot_error}") from self._boot_error

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._boot())
        except BaseException as exc:
            self._boot_error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()

    async def _boot(self) -> None:

        # Answers are moderated as they stream: load the classifiers while the engines load, not
        # in the middle of the first answer (a load takes seconds, and the stream waits for it).
        classifiers_prepare()
        self.runner = Runner(worker_name=self.name, loop=self.loop)
        specs = await db_async(lambda: [engine_spec_for(deployment_get(name=n)) for n in self.deployments])()
        for spec in specs:
            host = engine_host_for(spec)
            host.add_listener(engine_status_broadcast)
            host.start()
        self._tasks = [
            self.loop.create_task(heap_freeze_when_warm(process_warm)),
            self.loop.create_task(self._heartbeat()),
            self.loop.create_task(self._listen_for_aborts()),
            self.loop.create_task(reap_forever()),
        ]

    def _runner(self) -> Runner:
        if self.runner is None:
            raise RuntimeError("the worker's engine loop has not started")
        return self.runner

    def run(self, generation_id: str, *, order: dict[str, Any] | None = None) -> None:
        """Run one generation to its end, blocking the calling (Celery) thread meanwhile."""
        self._runner().submit_threadsafe(generation_id, order=order).result()

    def status(self) -> dict[str, Any]:
        """What the heartbeat publishes. It runs on the engine loop every second, so nothing here may
        take long: every stream on the loop waits while it runs."""

        hosts = engine_hosts()
        return {
            "pid": os.getpid(),
            "at": time.time(),
            "active": self.runner.active if self.runner is not None else 0,
            # What the reaper compares this worker's running rows with (reap_once).
            "running": self.runner.running_ids() if self.runner is not None else [],
            "engine_requests": sum(h.unfinished_requests() for h in hosts.values()),
            "engines": {n: h.state.value for n, h in hosts.items()},
            "dtypes": {n: h.dtype for n, h in hosts.items() if h.dtype},
            "moderation": "ready" if classifiers_loaded() else "loading",
            "heap_frozen_objects": heap_frozen_count(),
        }

    async def _heartbeat(self) -> None:

        client = _async_redis()
        ttl = settings.INFERENCE_WORKER_HEARTBEAT_TTL_S
        while True:
            try:
                hosts = engine_hosts()
                now = time.time()
                async with client.pipeline(transaction=False) as pipe:
                    pipe.set(WORKER_KEY.format(name=self.name), json.dumps(self.status()), ex=ttl)
                    for name, host in hosts.items():
                        key = ENGINE_STATE_KEY.format(deployment=name, state=host.state.value)
                        pipe.zadd(key, {self.name: now})
                        pipe.expire(key, ttl * 10)
                    await pipe.execute()
            except Exception:
                logger.exception("heartbeat failed")
            await asyncio.sleep(1)

    async def _listen_for_aborts(self) -> None:
        delay = 0.0  # after a dropped connection: try again at once, so a stop missed meanwhile lands in ms
        while True:
            # Its own connection with no read timeout: it waits, idle, for the next abort or release.
            pubsub = _async_redis(socket_timeout=None, client_name=ABORT_LISTENER_NAME).pubsub()
            try:
                await pubsub.subscribe(ABORT_CHANNEL, RELEASE_CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        if message["channel"].decode() == RELEASE_CHANNEL:
                            self._runner().release(message["data"].decode())
                        else:
                            self._runner().abort(message["data"].decode())
                    elif message.get("type") == "subscribe" and message["channel"].decode() == ABORT_CHANNEL:
                        delay = 0.0
                        await self._abort_stops_missed()
            except Exception:
                logger.exception("abort listener failed; reconnecting")
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(delay)
            delay = min(ABORT_LISTENER_RETRY_MAX_S, max(0.05, 2 * delay))  # backing off while Redis stays away

    async def _abort_stops_missed(self) -> None:
        """Redis pub/sub delivers at most once: a stop published while the listener was connecting
        (at boot, or after a lost connection) never reaches it. Once it is subscribed again (Redis
        confirms it), every stop published from then on arrives, and the web process marks a stop in
        the database before it publishes one: so the stops missed before are all in the database."""

        streaming = self._runner().streaming_ids()
        if streaming:
            for generation_id in await db_async(generation_ids_stop_requested)(ids=streaming):
                logger.info(
                    "generation %s: applying a stop published while the abort listener reconnected", generation_id
                )
                self._runner().abort(generation_id)

    def stop(self) -> None:

        async def close() -> None:
            for task in self._tasks:
                task.cancel()
            for host in engine_hosts().values():
                await host.aclose()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=60)


_runtime: WorkerRuntime | None = None


def worker_command(*, queues: list[str], node: str, concurrency: int, loglevel: str = "INFO") -> list[str]:
    """The command line of a GPU worker, as the Procfile starts one: the threads pool (one engine per
    process, which a prefork child could not start), no gossip or mingle (workers share nothing but
    Redis). For the processes the tests and benchmarks start themselves."""
    return [
        *(sys.executable, "-m", "celery", "-A", "chatsite", "worker", "-P", "threads", "-c", str(concurrency)),
        *("-Q", ",".join(queues), "-n", node, "--without-gossip", "--without-mingle", "-l", loglevel),
    ]


def worker_runtime_start(*, queues: list[str], name: str = "", pool: Any = None) -> WorkerRuntime:
    global _runtime
    if pool is not None and "prefork" in str(pool).lower():
        raise RuntimeError("GPU workers need `-P threads` or `-P solo`: vLLM cannot start inside prefork children")
    if _runtime is None:
        name = name or f"worker@{socket.gethostname()}:{os.getpid()}"
        runtime = WorkerRuntime(name=f"{name}:{os.getpid()}", deployments=_deployments_from_queues(queues))
        runtime.start()
        _runtime = runtime
        logger.info("worker %s hosts %s", _runtime.name, ", ".join(_runtime.deployments))
    return _runtime


def worker_runtime() -> WorkerRuntime:
    return _runtime or worker_runtime_start(queues=[])


def worker_runtime_stop() -> None:
    if _runtime is not None:
        _runtime.stop()


# --- the web side ---------------------------------------------------------------------------------

# One client per Redis URL (a test may point the process at a Redis of its own).
_sync_clients: dict[str, Any] = {}
# Per event loop, held weakly: a closed loop's id can be reused by a new loop, the loop itself cannot.
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, Any]] = weakref.WeakKeyDictionary()


def _redis() -> Any:
    url = settings.REDIS_URL
    client = _sync_clients.get(url)
    if client is None:
        client = _sync_clients[url] = redis_client(url)
    return client


def _async_redis(**options: Any) -> Any:
    """One client per event loop (and URL and options): redis.asyncio connections belong to their loop."""
    clients = _async_clients.setdefault(asyncio.get_running_loop(), {})
    key = (settings.REDIS_URL, *sorted(options.items()))
    if key not in clients:
        clients[key] = redis_async_client(settings.REDIS_URL, **options)
    return clients[key]


def worker_status(name: str) -> dict[str, Any] | None:
    raw = _redis().get(WORKER_KEY.format(name=name))
    return json.loads(raw) if raw else None


def abort_broadcast(generation_id: Any) -> None:
    """Tell every worker to abort this generation if it is running it (within a second)."""
    _redis().publish(ABORT_CHANNEL, str(generation_id))


def release_broadcast(generation_id: Any) -> None:
    """Tell every worker that this held generation's text may be shown. A worker that misses it
    (its listener reconnecting) finds it in the database within a second (Runner._verdict)."""
    _redis().publish(RELEASE_CHANNEL, str(generation_id))


def worker_engine_state(host: str) -> str:
    """ready if any live worker's engine host of that name (`EngineSpec.host_name`) is ready, else
    loading if one is loading, else failed if one failed to load, else offline (no live worker hosts it)."""
    client = _redis()
    since = time.time() - settings.INFERENCE_WORKER_HEARTBEAT_TTL_S
    for state in ("ready", "loading", "failed"):
        if client.zcount(ENGINE_STATE_KEY.format(deployment=host, state=state), since, "+inf"):
            return state
    return "offline"


def workers_alive(names: set[str]) -> set[str]:
    if not names:
        return set()
    ordered = sorted(names)
    pipe = _redis().pipeline(transaction=False)
    for name in ordered:
        pipe.exists(WORKER_KEY.format(name=name))
    return {name for name, exists in zip(ordered, pipe.execute(), strict=True) if exists}


def heartbeats_complete() -> bool:
    """Whether every live worker's heartbeat is in Redis: true once Redis has been up for a
    heartbeat TTL. A Redis restarted without persistence starts empty, and until each worker has
    beaten on it again a missing heartbeat is no sign of a dead worker."""
    uptime = _redis().info("server").get("uptime_in_seconds", 0)
    return float(uptime) >= settings.INFERENCE_WORKER_HEARTBEAT_TTL_S


def workers_running(names: set[str]) -> dict[str, tuple[float, set[str]]]:
    """For each of these workers that is alive and publishes them: when its heartbeat's status was
    taken, and the generations its runner was running then."""
    if not names:
        return {}
    ordered = sorted(names)
    pipe = _redis().pipeline(transaction=False)
    for name in ordered:
        pipe.get(WORKER_KEY.format(name=name))
    running = {}
    for name, raw in zip(ordered, pipe.execute(), strict=True):
        status = json.loads(raw) if raw else {}
        if "running" in status and "at" in status:
            running[name] = (float(status["at"]), set(status["running"]))
    return running


LOST_MESSAGE = "The server working on this answer stopped. Your message is saved: regenerate to try again."


async def reap_once() -> int:
    """End generations that nobody is running any more; returns how many. Safe to run in many
    processes (the end is a conditional update: one of them records it).

    A generation is lost when its worker's heartbeat has expired (the worker died), or when its
    worker is alive but its runner no longer runs it: the runner crashed, or could not record the
    end (the database was unreachable for longer than its retries). A live worker's heartbeat
    lists what its runner runs, from before each claim until the end is recorded, so a `running`
    row of that worker's claimed a heartbeat TTL before that list was taken, and not in it, has
    no runner. Either way the answer keeps the text streamed so far, its completion tokens counted
    from that text with the deployment's tokenizer (the engine's count died with the runner), and
    ends as failed with `worker_lost`; the client is told.
    """

    ttl = settings.INFERENCE_WORKER_HEARTBEAT_TTL_S

    def orphans() -> list[tuple[Any, str, str]]:
        running = list(
            Generation.objects.filter(status=Generation.Status.RUNNING)
            .exclude(worker__startswith="local:")
            .select_related("deployment")
            .only("id", "worker", "started_at", "deployment__model")
        )
        alive = workers_alive({generation.worker for generation in running})
        runs = workers_running(alive)
        # A heartbeat missing from a Redis that restarted less than a TTL ago says nothing: the
        # restart emptied it, and a live worker beats on it again within a second or two.
        absent = {generation.worker for generation in running} - alive
        absent_means_dead = bool(absent) and heartbeats_complete()
        lost = []
        for generation in running:
            gid, worker, started = generation.id, generation.worker, generation.started_at
            if not started:
                continue
            if worker not in alive:
                gone = absent_means_dead and started.timestamp() < time.time() - ttl
            elif worker in runs:
                seen_at, ids = runs[worker]
                gone = str(gid) not in ids and started.timestamp() < seen_at - ttl
            else:
                gone = False  # a worker that does not say what it runs: only its death tells
            if gone:
                lost.append((gid, worker, generation.deployment.model_path))
        return lost

    reaped = 0
    # Repeated on a new connection if the database dropped this one: it only reads.
    for generation_id, worker, model_path in await db_async(reconnecting(orphans))():
        reaped += await generation_end_orphaned(generation_id=generation_id, worker=worker, model_path=model_path)
    return reaped


async def generation_end_orphaned(*, generation_id: Any, worker: str, model_path: str | None = None) -> bool:
    """End a generation whose runner is gone, and tell its followers; False when it had ended.

    It keeps the text streamed so far, its completion tokens counted from that text with the
    deployment's tokenizer (`model_path`; read from the row when not given). The row is ended even
    when the replay buffer cannot be read (Redis restarting): the text the stream had shown is lost
    then, but a follower learns the end from the row (`ends_from_rows`)."""

    try:
        publisher = await StreamPublisher.continuing(generation_id, ahead_if_lost=True)
    except Exception:
        logger.exception("generation %s: its stream cannot be read; ending it without telling it", generation_id)
        publisher = None
    text = publisher.text if publisher is not None else ""
    if model_path is None and text:
        model_path = await db_async(_model_path_of)(generation_id)
    completion_tokens = await asyncio.to_thread(_tokens_in, model_path, text) if model_path else 0
    finished = await db_async(reconnecting(generation_finish, again=True))(
        generation_id=generation_id,
        status="failed",
        text=text,
        completion_tokens=completion_tokens,
        error_code="worker_lost",
        error_message=LOST_MESSAGE,
    )
    if finished is None:
        return False
    logger.warning("generation %s was running on %s, which no longer runs it; ended it", generation_id, worker)
    if publisher is not None:
        await publisher.fail(code="worker_lost", message=LOST_MESSAGE)
    return True


def _model_path_of(generation_id: Any) -> str | None:

    generation = Generation.objects.select_related("deployment").only("deployment__model").filter(id=generation_id)
    found = generation.first()
    return found.deployment.model_path if found is not None else None


def _tokens_in(model_path: str, text: str) -> int:
    """How many tokens the deployment's tokenizer makes of `text` (what the engine had generated)."""
    if not text:
        return 0

    try:
        return count_tokens(tokenizer_for(model_path), text)
    except Exception:  # no tokenizer here (a web host without the model's files): count nothing, end it all the same
        logger.exception("could not count the tokens of an answer of %s", model_path)
        return 0


BROKER_MARK_KEY = "chatsite:broker:kept"  # no expiry: a Redis without it has lost its data


def generations_resent_if_broker_emptied() -> list[Any]:
    """Send again the tasks a Redis restarted without persistence lost; returns the ids sent.

    The restart empties the broker's queues, and a generation queued before it would wait for ever.
    Redis holds a mark that an emptied Redis lacks: the first process to find it missing sets it
    and sends again the task of every generation still queued from before this Redis started (those
    queued since are in it; two seconds' more cover the clocks' disagreement). A duplicate costs
    nothing (the claim lets one copy run), so a mark lost otherwise (FLUSHDB) is harmless.
    """
    from datetime import UTC, datetime

    client = _redis()
    if not client.set(BROKER_MARK_KEY, time.time(), nx=True):
        return []
    try:
        started = time.time() - float(client.info("server").get("uptime_in_seconds", 0))
        return reconnecting(generations_redispatch_queued)(before=datetime.fromtimestamp(started + 2, tz=UTC))
    except BaseException:
        client.delete(BROKER_MARK_KEY)  # not sent: the next round, here or elsewhere, tries again
        raise


async def reap_forever(interval: float = 2.0) -> None:
    """Every `interval` seconds: end dead workers' generations, send again the tasks an emptied
    Redis lost, and age waiting ones' priorities."""

    while True:
        try:
            await reap_once()
            if settings.INFERENCE_BACKEND == "celery":
                resent = await db_async(generations_resent_if_broker_emptied)()
                if resent:
                    logger.warning("Redis had lost the tasks of %d queued generations; sent them again", len(resent))
            await db_async(reconnecting(generation_promote_waiting))()
        except Exception:
            logger.exception("reaper failed")
        await asyncio.sleep(interval)
