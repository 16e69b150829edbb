"""The engine host's process-level settings, checked on the real engine (embedded or in a worker)."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest
from django.conf import settings

from chatsite.cpu import cpu_has_native_bf16
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.engine.host import EngineRequestError, engine_dtype
from tests.helpers.sockets import drain_until_finished, next_event, open_socket

pytestmark = [pytest.mark.engine, pytest.mark.django_db]


@pytest.mark.parametrize(
    ("requested", "on_cpu", "native_bf16", "handed_to_vllm"),
    [
        ("auto", True, True, "bfloat16"),
        ("auto", True, False, "float32"),  # emulated bfloat16 is several times slower
        ("auto", False, False, "auto"),  # on a GPU, vLLM's own choice: the checkpoint's dtype
        ("bfloat16", True, False, "bfloat16"),  # an operator's explicit choice is kept
        ("float32", True, True, "float32"),
    ],
)
def test_auto_is_bfloat16_only_where_the_hardware_computes_in_it(requested, on_cpu, native_bf16, handed_to_vllm):
    assert engine_dtype(requested, on_cpu=on_cpu, native_bf16=native_bf16) == handed_to_vllm


async def test_the_default_deployment_computes_in_what_this_cpu_has_natively(engine):
    assert DEFAULT_DEPLOYMENT_FIELDS["dtype"] == "auto"
    expected = "bfloat16" if cpu_has_native_bf16() else "float32"
    assert await engine.engine_dtype(settings.INFERENCE_DEFAULT_DEPLOYMENT) == expected


@pytest.mark.skipif(settings.INFERENCE_BACKEND != "local", reason="the engine lives in a worker process there")
async def test_a_request_vllm_refuses_is_an_engine_error_with_its_reason(engine):
    # vLLM's validation raises its own client errors, not ValueError.
    with pytest.raises(EngineRequestError, match="temperature"):
        async for _ in engine.host.stream(
            request_id="refused", prompt_token_ids=[1, 2], sampling={"max_tokens": 2, "temperature": -1.0}
        ):
            pass
    assert engine.host.unfinished_requests() == 0


@pytest.mark.django_db(transaction=True)
async def test_on_the_cpu_the_scheduler_sleeps_while_the_model_computes(engine, alice):
    # vLLM's scheduler process busy-waits for each step's output, a whole core for as long as it
    # generates; on a CPU host it sleeps through each step instead, so that core is the stack's.
    assert settings.INFERENCE_CPU_SCHEDULER_SPIN_MS < 10
    host = psutil.Process(engine.pid)
    schedulers = [p for p in host.children(recursive=True) if p.name().startswith("VLLM::EngineCor")]
    assert schedulers, [p.name() for p in host.children(recursive=True)]

    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "Tell me a long story about a lighthouse keeper."})
    first = await next_event(socket)
    while first["type"] != "generation.delta":
        assert first["type"] not in ("generation.done", "generation.error", "error"), first
        first = await next_event(socket)
    before = [sum(p.cpu_times()[:2]) for p in schedulers]
    started = time.monotonic()
    await asyncio.sleep(1.0)  # the answer streams on meanwhile; its events wait in the socket
    busy = max(sum(p.cpu_times()[:2]) - was for p, was in zip(schedulers, before, strict=True))
    seconds = time.monotonic() - started
    await socket.send_json_to({"type": "generation.stop", "generation": first["generation"]})
    events = await drain_until_finished(socket)
    await socket.disconnect()

    done = events[-1]
    assert done["type"] == "generation.done", done
    # The answer was still being generated when the second ended: its stop cut it short.
    assert done["status"] == "stopped", done
    # Busy-waiting, the scheduler would have used about a core: here it used a fraction of one.
    assert busy < 0.5 * seconds, f"the scheduler process used {busy:.2f} s of CPU in {seconds:.2f} s of generation"


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
