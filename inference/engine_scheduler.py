"""vLLM's scheduler, as it should run on a CPU host: asleep while a step is computed.

It is imported inside vLLM's scheduler process (`scheduler_cls`), so it depends on vLLM alone, never
on Django or the rest of the project.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler

from inference.engine_worker import shorten_spin

# The key in vLLM's `additional_config` that carries the seconds to busy-wait.
SPIN_KEY = "chatsite_scheduler_spin_s"


class CpuHostScheduler(Scheduler):
    """vLLM's own scheduler; only how its process waits for a step's output changes.

    The scheduler process hands a step to the model process, then waits for its output on a
    shared-memory queue, busy-waiting for one second after each read before it sleeps until
    notified. While it generates, a step's output comes every 30-50 ms, so it never sleeps: a whole
    core spent on nothing, which on a CPU host is a core the web process, the Celery worker,
    PostgreSQL and Redis then share with it. Told to busy-wait only `SPIN_KEY` seconds, it sleeps
    through each step and is woken by the queue's notification when the output is written.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The executor and its queues exist by now: they are made before the scheduler.
        additional = self.vllm_config.additional_config
        seconds = additional.get(SPIN_KEY) if isinstance(additional, dict) else None
        if seconds is not None:
            shorten_spin(float(seconds))
