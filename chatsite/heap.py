"""Keeping the garbage collector off what a serving process loaded at start-up.

A web or worker process holds hundreds of thousands of objects (about 800,000 in a worker) once it
has loaded Django, the moderation classifiers and, in a worker, vLLM's front end. CPython's full
(oldest-generation) collection walks every one of them while holding the GIL, for a large part of
a second (docs/performance.md), during which the process's event loop and every stream on it stand still. Those objects live as long as the process, so once
the process is warm they are moved out of the collector's sight (`gc.freeze`, as vLLM does in its
own engine process); a full collection then walks only what was allocated since. Reference
counting still frees everything as before; only cycles among the frozen objects are never
collected, and those were loaded to stay.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

_frozen_count = 0  # what the freeze moved out of the collector's sight; 0 until it has run


def heap_freeze() -> float:
    """Collect once, then freeze every object left; returns the seconds it took."""
    global _frozen_count
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    # Counted once, here: `gc.get_freeze_count()` walks the whole frozen list with the GIL held,
    # stalling every stream on the loop, so it is no figure to ask for on a live process.
    _frozen_count = gc.get_freeze_count()
    return time.perf_counter() - started


def heap_frozen() -> bool:
    return _frozen_count > 0


def heap_frozen_count() -> int:
    """How many objects the freeze moved out of the collector's sight (0 before it)."""
    return _frozen_count


async def heap_freeze_when_warm(warm: Callable[[], bool], *, poll_s: float = 0.5) -> None:
    """Freeze the heap once `warm()` says start-up is over (once per process)."""
    while True:
        if warm():
            break
        await asyncio.sleep(poll_s)
    if heap_frozen():
        return
    took = heap_freeze()
    logger.info("start-up heap frozen (%d objects) in %.0f ms", _frozen_count, took * 1000)
