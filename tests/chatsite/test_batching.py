"""The batcher behind the moderation's scorers and the stream events' Redis pipelines."""

from __future__ import annotations

import asyncio

import pytest

from chatsite.batching import Batcher

pytestmark = pytest.mark.topology


class Doubles:
    """A batch function that doubles numbers, fails on negative ones, and remembers its batches."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()

    async def __call__(self, items: list[int]) -> list[int | Exception]:
        self.batches.append(items)
        await self.release.wait()
        if 0 in items:
            raise RuntimeError("the whole batch failed")
        return [ValueError(f"{n} is negative") if n < 0 else 2 * n for n in items]


async def test_items_handed_in_while_a_batch_runs_go_together_in_the_next():
    run = Doubles()
    batcher = Batcher(run)
    first = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.01)  # its batch is running
    rest = [asyncio.ensure_future(batcher.submit(n)) for n in (2, 3, 4)]
    run.release.set()
    assert await asyncio.wait_for(asyncio.gather(first, *rest), timeout=5) == [2, 4, 6, 8]
    assert run.batches == [[1], [2, 3, 4]]


async def test_an_items_own_failure_reaches_its_caller_alone():
    run = Doubles()
    run.release.set()
    batcher = Batcher(run)
    results = await asyncio.gather(batcher.submit(5), batcher.submit(-1), return_exceptions=True)
    assert results[0] == 10
    assert isinstance(results[1], ValueError)


async def test_a_failed_batch_reaches_all_its_callers_and_the_next_batch_runs():
    run = Doubles()
    run.release.set()
    batcher = Batcher(run)
    results = await asyncio.gather(batcher.submit(0), batcher.submit(7), return_exceptions=True)
    assert all(isinstance(result, RuntimeError) for result in results), results
    assert await asyncio.wait_for(batcher.submit(8), timeout=5) == 16


async def test_a_cancelled_caller_leaves_its_item_in_the_batch():
    """What was handed in is done: the stream events' `seq` must never leave a hole."""
    run = Doubles()
    batcher = Batcher(run)
    first = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.01)  # its batch is running
    cancelled = asyncio.ensure_future(batcher.submit(2))
    await asyncio.sleep(0.01)  # waiting for the next batch
    cancelled.cancel()
    run.release.set()
    assert await asyncio.wait_for(first, timeout=5) == 2
    assert await asyncio.wait_for(batcher.submit(3), timeout=5) == 6
    assert [n for batch in run.batches for n in batch] == [1, 2, 3]
    assert cancelled.cancelled()
