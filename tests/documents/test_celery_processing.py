"""The production topology's path for an uploaded file: the API saves it and, once that commits,
sends a task to the "documents" queue; a real `celery worker -Q documents` process (as the Procfile's
`documents` starts it) extracts, chunks, moderates, embeds and indexes it, and the owner's search
then finds its passage, which another user's does not."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from accounts.models import Tier
from documents.models import Chunk, Document, TierDocumentLimits
from tests.documents.test_answering import FACT
from tests.documents.test_apis import a_file, client_for
from tests.helpers.engines import CeleryWorker
from tests.helpers.images import encoded, needs_tesseract, scanned_pdf, text_image

pytestmark = [
    pytest.mark.topology,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        settings.DOCUMENTS_PROCESSING != "celery", reason="the Celery documents queue (the production topology)"
    ),
    # In one pytest-xdist process, so that they share its one worker (`documents_worker`).
    pytest.mark.xdist_group("documents_worker"),
]


@pytest.fixture(scope="module")
def documents_worker(django_db_setup):
    """One worker for the module's tests: a start (its imports, its classifiers, then the embedding
    model its first file loads) costs far more than any of them, and each test leaves it idle, its
    files ended, before the next flushes the database."""
    worker = CeleryWorker(deployments=[], name="test-documents", queues=["documents"])
    yield worker
    worker.kill()


@pytest.fixture(autouse=True)
def a_minute_is_not_enough_for_a_first_file(db):
    """The worker's first file, whichever test sends it, loads the embedding model as well: on a
    busy machine that alone can take the free plan's minute."""
    TierDocumentLimits.objects.update_or_create(
        tier=Tier.objects.get(name="free"), defaults={"processing_seconds": 600}
    )


def test_a_file_uploaded_through_the_api_is_processed_by_a_documents_worker(alice, bob, documents_worker):
    client = client_for(alice)
    response = client.post("/api/files/", {"file": a_file()}, format="multipart")
    assert response.status_code == 201, response.json()
    document_id = response.json()["id"]

    # The worker's first task loads the embedding model; a slow machine takes a while.
    deadline = time.monotonic() + 180
    while Document.objects.get(id=document_id).status in ("queued", "processing"):
        assert documents_worker.process.poll() is None, f"the worker exited; see {documents_worker.log.name}"
        assert time.monotonic() < deadline, f"not processed in 180 s; see {documents_worker.log.name}"
        time.sleep(0.5)

    detail = client.get(f"/api/files/{document_id}/").json()
    assert (detail["status"], detail["progress"], detail["chunk_count"]) == ("ready", 100, 1), detail["error"]
    assert Chunk.objects.filter(document_id=document_id, owner=alice).count() == 1
    found = client.get("/api/files/search/", {"q": "harbour master"}).json()["results"]
    assert [r["file"] for r in found] == ["harbour.md"] and found[0]["passage"] == FACT
    assert client_for(bob).get("/api/files/search/", {"q": "harbour master"}).json() == {"results": []}


@needs_tesseract
def test_an_image_and_a_scanned_pdf_are_read_by_ocr_on_a_documents_worker(alice, bob, documents_worker):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = client_for(alice)
    ids = []
    for name, data in (
        ("sign.png", encoded(text_image(["HARBOUR MASTER 1903", "ELIZA QUENNELL"]), "PNG")),
        ("scan.pdf", scanned_pdf(["TIDE TABLES KEPT", "BY THE HARBOUR OFFICE"])),
    ):
        response = client.post("/api/files/", {"file": SimpleUploadedFile(name, data)}, format="multipart")
        assert response.status_code == 201, response.json()
        ids.append(response.json()["id"])
    deadline = time.monotonic() + 240
    while Document.objects.filter(id__in=ids, status__in=("queued", "processing")).exists():
        assert documents_worker.process.poll() is None, f"the worker exited; see {documents_worker.log.name}"
        assert time.monotonic() < deadline, f"not processed in 240 s; see {documents_worker.log.name}"
        time.sleep(0.5)
    image, scan = (client.get(f"/api/files/{i}/").json() for i in ids)
    assert image["status"] == "ready", image["error"]
    assert "ELIZA QUENNELL" in image["ocr_text"] and image["ocr_confidence"] > 70
    assert scan["status"] == "ready", scan["error"]
    assert scan["ocr_pages"] == 1 and "TIDE TABLES" in scan["ocr_text"]
    found = client.get("/api/files/search/", {"q": "harbour master 1903"}).json()["results"]
    assert found[0]["file"] == "sign.png" and found[0]["heading"].startswith("Read from the image by OCR")
    assert client_for(bob).get(image["thumbnail_url"]).status_code == 404


def test_on_the_worker_a_users_slow_file_holds_up_no_one_and_deleting_it_stops_it(alice, bob, documents_worker):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from documents.services import document_delete
    from tests.documents.test_processing import docx_with, empty_paragraphs, plan

    plan(alice, max_paragraphs=None, processing_seconds=600)
    client = client_for(alice)
    slow_file = SimpleUploadedFile("slow.docx", docx_with(empty_paragraphs(150_000)))
    slow = client.post("/api/files/", {"file": slow_file}, format="multipart")
    assert slow.status_code == 201, slow.json()
    slow_id = slow.json()["id"]
    wait_until(lambda: status(slow_id) == "processing", documents_worker)
    alices_next = client.post("/api/files/", {"file": a_file("next.md", "Alice's second file.")}, format="multipart")
    bobs = client_for(bob).post("/api/files/", {"file": a_file()}, format="multipart")

    # The worker's first file loads the embedding model; a slow machine takes a while.
    wait_until(lambda: status(bobs.json()["id"]) == "ready", documents_worker, timeout=180)
    assert status(slow_id) == "processing" and status(alices_next.json()["id"]) == "queued"

    document_delete(document=Document.objects.get(id=slow_id))
    wait_until(lambda: status(alices_next.json()["id"]) == "ready", documents_worker)
    assert documents_worker.process.poll() is None


def status(document_id: int) -> str:
    return Document.objects.filter(id=document_id).values_list("status", flat=True).first() or "deleted"


def wait_until(condition, worker: CeleryWorker, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert worker.process.poll() is None, f"the worker exited; see {worker.log.name}"
        assert time.monotonic() < deadline, f"timed out; see {worker.log.name}"
        time.sleep(0.2)
