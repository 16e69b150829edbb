"""Where a generation runs: in this process (embedded default) or on a Celery GPU worker."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from typing import Any

from django.conf import settings

from chatsite.database import db_async
from inference.engine.base import host_names
from inference.engine.host import EngineState, engine_host_for, engine_hosts
from inference.execution.runner import Runner
from inference.execution.tasks import generation_run_task
from inference.execution.workers import (
    abort_broadcast,
    generation_end_orphaned,
    release_broadcast,
    worker_engine_state,
)
from inference.heartbeats import process_heartbeat_beat, process_heartbeats_forget
from inference.models import Generation
from inference.selectors import (
    LOCAL_WORKER_PREFIX,
    deployment_get,
    engine_spec_for,
    generation_ids_orphaned_locally,
)
from inference.streaming.streams import engine_status_broadcast

logger = logging.getLogger(__name__)


class LocalBackend:
    """Generation inside the web process, on the engine hosts this process owns.

    Several such processes may share one database (two servers on different ports, or on different
    hosts with one PostgreSQL). Each names itself uniquely (`name`: host, pid and a random part, so
    a restarted process that got the same pid is still another process) and keeps a heartbeat row
    fresh in the database (`ProcessHeartbeat`) while it serves. A generation running on a process
    whose heartbeat has gone silent for INFERENCE_WORKER_HEARTBEAT_TTL_S is ended by whichever
    process notices first, at its start-up or on its next beat; one on a live process is left to it.
    """

    def __init__(self) -> None:
        self.runner: Runner | None = None
        self.name = f"{LOCAL_WORKER_PREFIX}{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._keeping_alive: asyncio.Task | None = None

    async def start(self) -> None:
        """Load the local engines and accept work, on the serving event loop; idempotent.

        Returns once loading has begun, not when it ends: a message sent meanwhile waits in the
        runner for the engine instead of failing.
        """
        loop = asyncio.get_running_loop()
        if self.runner is not None and self.runner.loop is loop:
            return
        # Alive before it claims anything, so no other process takes its first answers for orphans.
        await db_async(process_heartbeat_beat)(name=self.name)
        self.runner = Runner(worker_name=self.name, loop=loop)
        specs = await db_async(
            lambda: [engine_spec_for(deployment_get(name=name)) for name in settings.INFERENCE_LOCAL_DEPLOYMENTS]
        )()
        for spec in specs:
            host = engine_host_for(spec)
            if not host._listeners:
                host.add_listener(engine_status_broadcast)
            host.start()
        previous = self._keeping_alive
        if previous is not None and not previous.get_loop().is_closed():  # a closed loop's task is gone
            previous.cancel()
        self._keeping_alive = loop.create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        """Recover what a previous run left, then beat, and end dead processes' answers, until stopped."""
        await self._recover()
        interval = settings.INFERENCE_WORKER_HEARTBEAT_TTL_S / HEARTBEATS_PER_TTL
        while True:
            await asyncio.sleep(interval)
            try:
                await db_async(process_heartbeat_beat)(name=self.name)
                await local_orphans_end(own=self.name)
            except Exception:  # the next beat tries again; missing a few is what the TTL allows for
                logger.exception("heartbeat of %s failed", self.name)

    async def _recover(self) -> None:
        """Pick up what a previous run of this process left: re-run queued work, and end the answers
        of processes that are gone (a process still beating keeps its own)."""

        def queued() -> list[Any]:
            qs = Generation.objects.filter(deployment__name__in=settings.INFERENCE_LOCAL_DEPLOYMENTS)
            return list(qs.filter(status=Generation.Status.QUEUED).values_list("id", flat=True))

        try:
            await local_orphans_end(own=self.name)
            await db_async(process_heartbeats_forget)(older_than_s=HEARTBEAT_FORGOTTEN_S)
        except Exception:
            logger.exception("ending dead processes' answers failed; the next beat tries again")
        for generation_id in await db_async(queued)():
            self.submit(generation_id)

    def submit(
        self, generation_id: Any, *, queue: str = "", priority: int = 0, order: dict[str, Any] | None = None
    ) -> None:
        # `queue` and `priority` are the broker's: the runner reads the priority from the order or the row.
        if self.runner is None:
            # Nothing is serving yet (e.g. a management command): the row stays queued and the
            # server picks it up when it starts.
            logger.warning("no local engine running; generation %s stays queued", generation_id)
            return
        self.runner.submit_threadsafe(generation_id, order=order)

    def abort(self, generation_id: Any) -> None:
        if self.runner is not None:
            self.runner.abort_threadsafe(generation_id)

    def release(self, generation_id: Any) -> None:
        if self.runner is not None:
            self.runner.release_threadsafe(generation_id)

    def host_state(self, host: str) -> str:
        found = engine_hosts().get(host)
        return found.state.value if found else EngineState.IDLE.value


local_backend = LocalBackend()

# A local process refreshes its heartbeat this many times within INFERENCE_WORKER_HEARTBEAT_TTL_S:
# every 2 s by default, so it must miss two beats running to be taken for dead.
HEARTBEATS_PER_TTL = 3
# A silent process's heartbeat row is removed at the next start-up this long after its last beat.
HEARTBEAT_FORGOTTEN_S = 24 * 3600


async def local_orphans_end(*, own: str) -> int:
    """End the generations still running on local processes that are gone (not `own`, this
    process), and tell their followers; returns how many."""
    ended = 0
    for generation_id in await db_async(generation_ids_orphaned_locally)(own=own):
        ended += await generation_end_orphaned(generation_id=generation_id, worker="a local process")
    return ended


class CeleryBackend:
    """Generation on Celery GPU workers (the production topology): the task goes to the deployment's
    queue, and stops, releases and engine states travel through Redis (`workers`)."""

    async def start(self) -> None:
        """Nothing to load in a web process: the workers host the engines."""

    def submit(
        self, generation_id: Any, *, queue: str = "", priority: int = 0, order: dict[str, Any] | None = None
    ) -> None:
        # The Redis transport reads priority 0 first, like vLLM; it knows ten steps. The order's
        # prompt is the user's text in token ids: the message's description (its headers, and the
        # events a monitor like Flower shows) says only how long it is, and Celery is spared
        # writing out a thousand characters of it with every dispatch.
        generation_run_task.apply_async(
            args=[str(generation_id)],
            kwargs={"order": order} if order is not None else {},
            kwargsrepr=order_description(order),
            queue=queue,
            priority=min(max(priority, 0), 9),
        )

    def abort(self, generation_id: Any) -> None:
        abort_broadcast(generation_id)

    def release(self, generation_id: Any) -> None:
        release_broadcast(generation_id)

    def host_state(self, host: str) -> str:
        return worker_engine_state(host)


# The one backend of this process, chosen once from its settings: everything goes through it, the
# services' dispatches, aborts and releases too, once InferenceConfig.ready installs it
# (inference.backend).
backend: LocalBackend | CeleryBackend = local_backend if settings.INFERENCE_BACKEND == "local" else CeleryBackend()


def order_description(order: dict[str, Any] | None) -> str:
    """What a task's order shows outside the task itself: its size, none of its prompt."""
    if order is None:
        return "{}"
    return f"{{'order': <a prompt of {len(order['prompt_token_ids'])} tokens>}}"


# What a host's state is where no process hosts it: here (idle), or among the workers (offline).
ABSENT = {EngineState.IDLE.value, "offline"}


def host_state(host: str) -> str:
    """The state of one engine host, by its exact name (`ModelDeployment.answer_model`)."""
    return backend.host_state(host)


def engine_state(deployment: str) -> str:
    """The state of the engine that answers for a deployment named without its row (the page's greeting,
    a readiness wait): its vLLM engine's where one is hosted, else its scripted one's (`host_names`)."""
    state = EngineState.IDLE.value
    for name in host_names(deployment):
        state = host_state(name)
        if state not in ABSENT:
            return state
    return state
