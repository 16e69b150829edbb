from __future__ import annotations

from celery import shared_task

from documents.services import STALE_PROCESSING, document_process

# When to try again a file whose owner has another in progress (one at a time per user, so one
# user's files never hold every worker); one another run holds waits until that run would be stale.
BUSY_RETRY_S = 3


@shared_task(name="documents.document_process", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def document_process_task(document_id: int) -> None:
    """Extract, chunk, moderate, embed and index one uploaded file (idempotent: see document_process)."""
    outcome = document_process(document_id=document_id)
    if outcome in ("busy", "running"):
        countdown = BUSY_RETRY_S if outcome == "busy" else int(STALE_PROCESSING.total_seconds()) + 1
        document_process_task.apply_async(args=[document_id], queue="documents", countdown=countdown)
