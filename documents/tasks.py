from __future__ import annotations

from celery import shared_task


@shared_task(name="documents.document_process", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def document_process_task(document_id: int) -> None:
    """Extract, chunk, moderate, embed and index one uploaded file (idempotent: see document_process)."""
    from documents.services import document_process

    document_process(document_id=document_id)
