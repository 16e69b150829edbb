"""The process's execution backend, as the services and the held answer reach it.

`inference.execution` runs generations and calls the services, so they cannot import it: they send
their work (a dispatch, an abort, a held answer's release) through the backend installed here at
start-up. `inference.execution.dispatch` chooses the backend (this process's runner, or the Celery
GPU workers), and `InferenceConfig.ready` installs it in every process, before any request.
"""

from __future__ import annotations

from typing import Any, Protocol


class Backend(Protocol):
    def submit(
        self, generation_id: Any, *, queue: str = "", priority: int = 0, order: dict[str, Any] | None = None
    ) -> None: ...

    def abort(self, generation_id: Any) -> None: ...

    def release(self, generation_id: Any) -> None: ...


_backend: Backend | None = None


def backend_install(backend: Backend) -> None:
    global _backend
    _backend = backend


def _installed() -> Backend:
    if _backend is None:
        raise RuntimeError("no execution backend installed: inference's AppConfig.ready installs it")
    return _backend


def generation_dispatch(
    *, generation_id: Any, queue: str, priority: int = 0, order: dict[str, Any] | None = None
) -> None:
    """Send a committed generation to its engine. `priority` follows vLLM: lower is served first.

    `order` (`generation_order`) lets the runner start the engine request before its claim; without
    one (a re-dispatch, a restart's recovery) the runner claims the row first and reads it there."""
    _installed().submit(generation_id, queue=queue, priority=priority, order=order)


def generation_abort(*, generation_id: Any) -> None:
    _installed().abort(generation_id)


def generation_gate_open(*, generation_id: Any) -> None:
    """Tell the runner holding a generation's text for its message's verdict that it may show it."""
    _installed().release(generation_id)
