"""Work handed in by many tasks on one event loop, done in batches without waiting on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """Runs `run_batch` over the items its callers hand in on one event loop.

    The first item goes at once; those handed in while a batch runs go together in the next, so a
    lone caller waits for nothing but its own batch. `run_batch` returns one result per item, in
    order, each a value or an exception for that item alone; if it raises, every item of the batch
    gets that exception. An item whose caller was cancelled meanwhile stays in its batch: what was
    handed in is done.
    """

    def __init__(self, run_batch: Callable[[list[T]], Awaitable[list[R | Exception]]]) -> None:
        self._run_batch = run_batch
        self._waiting: list[tuple[T, asyncio.Future]] = []
        self._runner: asyncio.Task | None = None  # held, so the loop cannot drop it mid-run

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append((item, future))
        if self._runner is None:
            self._runner = loop.create_task(self._run_waiting())
        return await future

    async def _run_waiting(self) -> None:
        batch: list[tuple[T, asyncio.Future]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    results = await self._run_batch([item for item, _ in batch])
                except Exception as exc:
                    results = [exc] * len(batch)
                for (_, future), result in zip(batch, results, strict=True):
                    if future.done():  # its caller was cancelled meanwhile
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            # Cancelled itself (its loop is closing): no caller may wait for ever.
            for _, future in batch + self._waiting:
                future.cancel()
            self._waiting = []
            self._runner = None
