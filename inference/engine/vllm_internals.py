"""Every reach into vLLM's private internals, in one module, each behind a check of the release it
was written for.

The rest of the project uses vLLM's public API (`AsyncLLM`, `AsyncEngineArgs`, `SamplingParams`,
`collective_rpc`). What is here relies on what vLLM does not promise to keep:

- the busy-wait of its shared-memory queues (`SpinCondition.busy_loop_s`), found with `gc` because
  vLLM keeps no handle on them, shortened in the model processes (`WorkerTuning`) and in the
  scheduler process (`CpuHostScheduler`, a subclass of its v1 `Scheduler`);
- `AsyncLLM.output_processor`, read for the number of requests the engine still holds.

On any other vLLM release `internals_supported()` is false: the engine host logs a warning and runs on
vLLM's own behaviour (no busy-wait tuning, no count of unfinished requests), and
tests/inference/test_vllm_internals.py fails until each reach is checked again on the new release and
`WRITTEN_FOR` moves with `requirements/cpu.txt` and `requirements/gpu.txt`, and with the fence around
vLLM's OpenAI server code (`vllm_server_internals.py`).

It is imported inside vLLM's worker and scheduler processes (`worker_extension_cls`,
`scheduler_cls`), so it depends on vLLM alone, never on Django or the rest of the project.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

logger = logging.getLogger(__name__)

# The vLLM release every reach below was written for and checked against.
WRITTEN_FOR = "0.32.0"

# The key in vLLM's `additional_config` that carries the scheduler's seconds to busy-wait.
SPIN_KEY = "chatsite_scheduler_spin_s"

# Where vLLM imports the classes below by name, in its own processes.
WORKER_EXTENSION = "inference.engine.vllm_internals.WorkerTuning"
CPU_HOST_SCHEDULER = "inference.engine.vllm_internals.CpuHostScheduler"


def vllm_release() -> str:
    """The installed vLLM's release, without a local build tag ("0.32.0+cpu" is "0.32.0")."""
    from vllm import __version__

    return __version__.split("+", 1)[0]


def internals_missing() -> list[str]:
    """What the reaches below expect of vLLM and do not find there, in words; empty when all is found."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.output_processor import OutputProcessor

    missing = []
    spin_parameters = inspect.signature(SpinCondition.__init__).parameters
    if not {"is_reader", "busy_loop_s"} <= set(spin_parameters):
        missing.append("SpinCondition(is_reader, busy_loop_s)")
    if "self.busy_loop_s" not in inspect.getsource(SpinCondition):
        missing.append("SpinCondition reading self.busy_loop_s as it waits")
    if "vllm_config" not in inspect.getsource(Scheduler.__init__):
        missing.append("Scheduler.__init__ keeping vllm_config")
    if "self.output_processor" not in inspect.getsource(AsyncLLM.__init__):
        missing.append("AsyncLLM.output_processor")
    if not callable(getattr(OutputProcessor, "get_num_unfinished_requests", None)):
        missing.append("OutputProcessor.get_num_unfinished_requests()")
    return missing


@functools.cache
def internals_supported() -> bool:
    """Whether the installed vLLM is the release these reaches were written for and has what they use.
    Logs once why not."""
    release = vllm_release()
    if release != WRITTEN_FOR:
        logger.warning(
            "vLLM %s is not %s, the release inference/engine/vllm_internals.py was written for: its busy-wait "
            "tuning and unfinished-request count are off",
            release,
            WRITTEN_FOR,
        )
        return False
    missing = internals_missing()
    if missing:
        logger.warning("vLLM %s lacks what inference/engine/vllm_internals.py uses: %s", release, ", ".join(missing))
        return False
    return True


def shorten_spin(seconds: float) -> int:
    """Busy-wait only `seconds` after a read on every shared-memory queue this process reads, then
    sleep until the writer's notification. Returns how many queues it changed."""
    import gc

    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    readers = [obj for obj in gc.get_objects() if isinstance(obj, SpinCondition) and obj.is_reader]
    for reader in readers:
        reader.busy_loop_s = seconds
    return len(readers)


class WorkerTuning:
    """A vLLM worker extension (`worker_extension_cls`): methods the engine host calls in every model
    process of its engine with `collective_rpc`."""

    def idle_after(self, seconds: float) -> int:
        """Busy-wait for the scheduler's next step only `seconds` after the last one, then sleep
        until notified (vLLM spins for one second). Returns how many queues it changed."""
        return shorten_spin(seconds)


def unfinished_requests(engine: Any) -> int:
    """How many requests `engine` (an AsyncLLM) still holds; 0 where the count cannot be read."""
    if not internals_supported():
        return 0
    return engine.output_processor.get_num_unfinished_requests()


class CpuHostScheduler(Scheduler):
    """vLLM's own scheduler (`scheduler_cls`); only how its process waits for a step's output changes.

    The scheduler process hands a step to the model process, then waits for its output on a
    shared-memory queue, busy-waiting for one second after each read before it sleeps until
    notified. While it generates a step's output comes every few tens of milliseconds, so it never
    sleeps: a whole core spent on nothing, which on a CPU host is a core the web process, the Celery
    worker, PostgreSQL and Redis share with it. Told to busy-wait only `SPIN_KEY` seconds, it sleeps
    through each step and is woken by the queue's notification when the output is written.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The executor and its queues exist by now: they are made before the scheduler.
        additional = self.vllm_config.additional_config
        seconds = additional.get(SPIN_KEY) if isinstance(additional, dict) else None
        if seconds is not None:
            shorten_spin(float(seconds))
