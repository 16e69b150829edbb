"""A vLLM worker extension: methods the engine host calls in every model process of its engine,
and the shortened busy-wait they share with the scheduler process (`inference/engine_scheduler.py`).

It is imported inside vLLM's worker and scheduler processes (`worker_extension_cls`,
`scheduler_cls`), so it depends on vLLM alone, never on Django or the rest of the project.
"""

from __future__ import annotations


class WorkerTuning:
    def idle_after(self, seconds: float) -> int:
        """Busy-wait for the scheduler's next step only `seconds` after the last one, then sleep
        until notified (vLLM spins for one second). Returns how many queues it changed."""
        return shorten_spin(seconds)


def shorten_spin(seconds: float) -> int:
    """Busy-wait only `seconds` after a read on every shared-memory queue this process reads, then
    sleep until the writer's notification. Returns how many queues it changed."""
    import gc

    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    # vLLM keeps no handle on its queues' wait conditions outside its executor's own objects.
    readers = [obj for obj in gc.get_objects() if isinstance(obj, SpinCondition) and obj.is_reader]
    for reader in readers:
        reader.busy_loop_s = seconds
    return len(readers)
