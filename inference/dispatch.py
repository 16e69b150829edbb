"""Where a generation runs: in this process (embedded default) or on a Celery GPU worker."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from django.conf import settings

from inference.engine import EngineState, engine_host_for, engine_hosts

logger = logging.getLogger(__name__)


class LocalBackend:
    """Generation inside the web process, on the engine hosts this process owns."""

    def __init__(self) -> None:
        self.runner = None

    async def start(self) -> None:
        """Load the local engines and accept work, on the serving event loop; idempotent.

        Returns once loading has begun, not when it ends: a message sent meanwhile waits in the
        runner for the engine instead of failing.
        """
        from chatsite.database import db_async
        from inference.runner import Runner
        from inference.selectors import deployment_get, engine_spec_for
        from inference.streaming import engine_status_broadcast

        loop = asyncio.get_running_loop()
        if self.runner is not None and self.runner.loop is loop:
            return
        self.runner = Runner(worker_name=f"local:{socket.gethostname()}:{os.getpid()}", loop=loop)
        specs = await db_async(
            lambda: [engine_spec_for(deployment_get(name=name)) for name in settings.INFERENCE_LOCAL_DEPLOYMENTS]
        )()
        for spec in specs:
            host = engine_host_for(spec)
            if not host._listeners:
                host.add_listener(engine_status_broadcast)
            host.start()
        loop.create_task(self._recover())

    async def _recover(self) -> None:
        """Pick up what a previous run of this process left: re-run queued work, end orphaned streams."""
        from chatsite.database import db_async
        from inference.models import Generation
        from inference.services import generation_finish

        def orphans() -> tuple[list[Any], list[Any]]:
            qs = Generation.objects.filter(deployment__name__in=settings.INFERENCE_LOCAL_DEPLOYMENTS)
            running = list(
                qs.filter(status=Generation.Status.RUNNING)
                .exclude(worker=self.runner.worker_name)
                .values_list("id", flat=True)
            )
            queued = list(qs.filter(status=Generation.Status.QUEUED).values_list("id", flat=True))
            return running, queued

        running, queued = await db_async(orphans)()
        for generation_id in running:
            await db_async(generation_finish)(
                generation_id=generation_id,
                status="failed",
                text="",
                error_code="interrupted",
                error_message="The server restarted mid-answer. Regenerate to try again.",
            )
        for generation_id in queued:
            self.runner.submit_threadsafe(generation_id)

    def submit(self, generation_id: Any, *, order: dict[str, Any] | None = None) -> None:
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

    def engine_state(self, deployment: str) -> str:
        host = engine_hosts().get(deployment)
        return host.state.value if host else EngineState.IDLE.value


local_backend = LocalBackend()


def generation_dispatch(
    *, generation_id: Any, queue: str, priority: int = 0, order: dict[str, Any] | None = None
) -> None:
    """Send a committed generation to its engine. `priority` follows vLLM: lower is served first.

    `order` (`generation_order`) lets the runner start the engine request before its claim; without
    one (a re-dispatch, a restart's recovery) the runner claims the row first and reads it there."""
    if settings.INFERENCE_BACKEND == "local":
        local_backend.submit(generation_id, order=order)
    else:
        from inference.tasks import generation_run_task

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


def order_description(order: dict[str, Any] | None) -> str:
    """What a task's order shows outside the task itself: its size, none of its prompt."""
    if order is None:
        return "{}"
    return f"{{'order': <a prompt of {len(order['prompt_token_ids'])} tokens>}}"


def generation_abort(*, generation_id: Any) -> None:
    if settings.INFERENCE_BACKEND == "local":
        local_backend.abort(generation_id)
    else:
        from inference.workers import abort_broadcast

        abort_broadcast(generation_id)


def generation_gate_open(*, generation_id: Any) -> None:
    """Tell the runner holding a generation's text for its message's verdict that it may show it."""
    if settings.INFERENCE_BACKEND == "local":
        local_backend.release(generation_id)
    else:
        from inference.workers import release_broadcast

        release_broadcast(generation_id)


def engine_state(deployment: str) -> str:
    if settings.INFERENCE_BACKEND == "local":
        return local_backend.engine_state(deployment)
    from inference.workers import worker_engine_state

    return worker_engine_state(deployment)
