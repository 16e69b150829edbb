from __future__ import annotations

import asyncio
import gc

import pytest

from chatsite import heap
from inference.engine.host import EngineHost, EngineState
from inference.execution.workers import process_warm
from inference.selectors import deployment_get, engine_spec_for
from moderation.classifiers import warm_up


@pytest.fixture
def thawed(monkeypatch):
    """Whatever a test freezes is given back to the collector after it."""
    monkeypatch.setattr(heap, "_frozen_count", 0)
    yield
    gc.unfreeze()


def _in_collector_sight(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


async def test_the_heap_is_frozen_once_the_process_is_warm(thawed):
    loaded = [[1, 2, 3]]  # stands for what start-up loads
    checks = []

    def warm() -> bool:
        checks.append(_in_collector_sight(loaded))
        return len(checks) >= 3

    await asyncio.wait_for(heap.heap_freeze_when_warm(warm, poll_s=0.01), timeout=5)
    assert checks == [True, True, True]  # nothing was frozen while it was still loading
    assert heap.heap_frozen()
    # A full collection no longer walks it; reference counting still owns it.
    assert not _in_collector_sight(loaded)
    assert loaded == [[1, 2, 3]]


def test_a_workers_status_reports_the_frozen_heap_without_walking_it(thawed, monkeypatch):
    # gc.get_freeze_count() walks every frozen object with the GIL held (75 ms in a worker); the
    # heartbeat builds this status on the engine loop every second, with every stream waiting.
    from inference.execution.workers import WorkerRuntime

    assert heap.heap_frozen_count() == 0
    heap.heap_freeze()
    frozen = heap.heap_frozen_count()
    assert frozen > 1000

    def walk() -> int:
        raise AssertionError("the frozen heap was walked")

    monkeypatch.setattr(gc, "get_freeze_count", walk)
    runtime = WorkerRuntime(name="w", deployments=[])
    status = runtime.status()
    runtime.loop.close()
    assert status["heap_frozen_objects"] == frozen


async def test_the_heap_is_frozen_once_per_process(thawed):
    await heap.heap_freeze_when_warm(lambda: True)
    later = [object()]
    await heap.heap_freeze_when_warm(lambda: True)
    assert _in_collector_sight(later)


@pytest.mark.django_db
def test_a_process_is_warm_when_its_classifiers_and_engines_have_loaded(monkeypatch):
    from inference.engine import host as engine_module

    warm_up()  # the classifiers
    host = EngineHost(engine_spec_for(deployment_get()))
    monkeypatch.setattr(engine_module, "_hosts", {"loading-model": host})
    for state, warm in [
        (EngineState.IDLE, True),  # never started: nothing to wait for
        (EngineState.LOADING, False),
        (EngineState.READY, True),
        (EngineState.FAILED, True),
    ]:
        host.state = state
        assert process_warm() is warm, state
