"""The engine host's process-level settings, checked on the real engine (embedded or in a worker)."""

from __future__ import annotations

import os

import psutil
import pytest
from django.conf import settings

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
