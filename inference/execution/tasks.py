from __future__ import annotations

from typing import Any

from celery import shared_task

from inference.execution.workers import worker_runtime


@shared_task(name="inference.generation_run", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def generation_run_task(generation_id: str, order: dict[str, Any] | None = None) -> None:
    """Run one generation on this worker's engine. Idempotent: the claim lets only one run show and
    record it. `order`: what the engine needs to start it before the claim (`generation_order`)."""
    worker_runtime().run(generation_id, order=order)
