"""The engine host's process-level settings, checked on the real engine (embedded or in a worker)."""

from __future__ import annotations

import asyncio
import os

import psutil
import pytest
from django.conf import settings

from tests.conftest import drain_until_finished, open_socket

pytestmark = [pytest.mark.engine, pytest.mark.django_db]


async def test_on_the_cpu_the_engines_spinning_scheduler_yields_to_the_stack(engine):
    # The scheduler process busy-waits for the model process; it runs at a lower priority so the web
    # process and the worker are not halved by it. The model process, which does the work, does not.
    host = psutil.Process(engine.pid)
    children = host.children(recursive=True)
    schedulers = [p for p in children if p.name().startswith("VLLM::EngineCor")]
    models = [p for p in children if p.name().startswith("VLLM::Worker")]
    assert schedulers and models, [p.name() for p in children]

    host_nice = os.getpriority(os.PRIO_PROCESS, host.pid)
    expected = min(19, host_nice + settings.INFERENCE_CPU_SCHEDULER_NICE)
    assert {os.getpriority(os.PRIO_PROCESS, p.pid) for p in schedulers} == {expected}
    assert expected > host_nice
    assert {os.getpriority(os.PRIO_PROCESS, p.pid) for p in models} == {host_nice}


@pytest.mark.django_db(transaction=True)
async def test_on_the_cpu_the_model_process_sleeps_soon_after_an_answer(engine, alice):
    # vLLM's model process busy-waits for one second after every step it is given; on a CPU host it
    # is told to sleep after INFERENCE_CPU_WORKER_SPIN_MS, so the core is free for the next message.
    assert settings.INFERENCE_CPU_WORKER_SPIN_MS < 200
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "Say hello."})
    events = await drain_until_finished(socket)
    assert events[-1]["type"] == "generation.done", events[-1]
    await socket.disconnect()

    await asyncio.sleep(0.3)  # well past the spin, well inside vLLM's one second
    models = [p for p in psutil.Process(engine.pid).children(recursive=True) if p.name().startswith("VLLM::Worker")]
    assert models
    before = [sum(p.cpu_times()[:2]) for p in models]
    await asyncio.sleep(0.5)
    busy = max(sum(p.cpu_times()[:2]) - was for p, was in zip(models, before, strict=True))
    assert busy < 0.2, f"the model process used {busy:.2f} s of CPU in 0.5 s while idle"
