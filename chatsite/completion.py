"""Work that must run to its end once begun, whatever becomes of the code that awaits it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_running: set[asyncio.Future[Any]] = set()


async def run_to_end(work: Coroutine[Any, Any, T]) -> T:
    """Await `work`, which goes on to its end even if the caller is cancelled (a socket closed, a
    client gone): committed work that must still be settled, released or withdrawn. The caller's
    cancellation reaches the caller alone; what `work` raises after that is retrieved and dropped."""
    task = asyncio.ensure_future(work)
    _running.add(task)  # a task nothing else holds could be collected mid-way
    task.add_done_callback(_ended)
    return await asyncio.shield(task)


def _ended(task: asyncio.Future[Any]) -> None:
    _running.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a caller that went away leaves no "never retrieved" warning
