"""ASGI lifespan: start loading the local engines and the moderation classifiers when the server
starts, shut the engines down when it stops.

Servers without lifespan support (daphne, under `runserver`) start them on the first chat socket
instead (`StartedBeforeSockets`, around the socket routes in chatsite/asgi.py): the chat socket
itself never starts an engine.

A server asked to stop waits for its open responses before it sends the lifespan's shutdown, and a
streamed answer's response is open until its answer ends: minutes, so a restart would hang on it or
cut it at the server's graceful timeout. So the stop signal itself is heard here too (alongside the
server's own handler, which still runs): every stream this process follows ends at once, telling its
client that the server is restarting (`inference.streaming.streams.streams_end_for_restart`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Any

from chatsite.heap import heap_freeze_when_warm
from inference.engine.host import engine_hosts
from inference.execution.dispatch import backend, local_backend
from inference.execution.workers import process_warm, reap_forever
from inference.signals import server_started
from inference.streaming.streams import streams_end_for_restart
from moderation.services import classifiers_prepare

logger = logging.getLogger(__name__)


# The event loop the engines were started on, by the lifespan or by a first socket.
_started_on: asyncio.AbstractEventLoop | None = None


async def _start() -> None:
    global _started_on
    # Every message is checked before it is queued: load the classifiers before the first.
    classifiers_prepare()
    await backend.start()
    _started_on = asyncio.get_running_loop()


class StartedBeforeSockets:
    """ASGI middleware for the socket routes: the engines and classifiers started before the first
    socket is served, where no lifespan started them (daphne); idempotent, and free once started."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if _started_on is not asyncio.get_running_loop():
            await _start()
        return await self.app(scope, receive, send)


async def lifespan_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    reaper, freezing = None, None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await _start()
                if backend is not local_backend:
                    # Web processes also end generations whose worker died, so a client hears of
                    # it even when no other worker is up.
                    reaper = asyncio.get_running_loop().create_task(reap_forever())
            except Exception as exc:
                logger.exception("start-up failed")
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            _streams_end_on_stop_signals()
            server_started.send(sender=None)
            # Out of the garbage collector's sight once loaded (chatsite/heap.py).
            freezing = asyncio.get_running_loop().create_task(heap_freeze_when_warm(process_warm))
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            for task in (reaper, freezing):
                if task is not None:
                    task.cancel()
            for host in engine_hosts().values():
                await host.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return


def _streams_end_on_stop_signals() -> None:
    """Have SIGTERM and SIGINT end this process's streams before the server's own handler runs.

    uvicorn installs its handlers before the lifespan starts and puts back the ones it found when it
    exits; a handler it did not install (another server, a process with none) is left as it was."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        server_handler = signal.getsignal(signum)
        if not callable(server_handler):
            continue

        def handler(signum: int, frame: Any, server_handler: Any = server_handler) -> None:
            streams_end_for_restart()
            server_handler(signum, frame)

        signal.signal(signum, handler)
