"""ASGI lifespan: start loading the local engines and the moderation classifiers when the server
starts, shut the engines down when it stops.

Servers without lifespan support (daphne) start them on the first chat socket instead.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django.conf import settings

from chatsite.heap import heap_freeze_when_warm
from inference.dispatch import local_backend
from inference.engine import engine_hosts
from inference.workers import reap_forever
from moderation.services import classifiers_prepare

logger = logging.getLogger(__name__)


async def lifespan_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    reaper, freezing = None, None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            # Every message is checked before it is queued: load the classifiers before the first.
            classifiers_prepare()
            try:
                if settings.INFERENCE_BACKEND == "local":
                    await local_backend.start()
                else:
                    # Web processes also end generations whose worker died, so a client hears of
                    # it even when no other worker is up.
                    reaper = asyncio.get_running_loop().create_task(reap_forever())
            except Exception as exc:
                logger.exception("start-up failed")
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            # Out of the garbage collector's sight once loaded (chatsite/heap.py).
            freezing = asyncio.get_running_loop().create_task(heap_freeze_when_warm())
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            for task in (reaper, freezing):
                if task is not None:
                    task.cancel()
            for host in engine_hosts().values():
                await host.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
