from __future__ import annotations

import pytest

from chatsite.errors import ClientError
from documents.models import Chunk, Document
from documents.retrieval import retrieve_for_message
from documents.services import document_delete, document_upload
from tests.documents.conftest import docx_bytes, pdf_bytes

pytestmark = pytest.mark.django_db

HANDBOOK = """# The lighthouse

The lighthouse on Skerry Point was built in 1871 from granite quarried at Dunmore.

# The keeper

Its last keeper, Morag Fennimore, kept a logbook of every storm between 1952 and 1978.
"""


def test_a_markdown_file_becomes_chunks_with_headings(alice, upload_ready):
    document = upload_ready(alice, "handbook.md", HANDBOOK)
    assert document.status == Document.Status.READY and document.progress == 100
    chunks = list(document.chunks.order_by("ordinal"))
    assert [c.heading for c in chunks] == ["The lighthouse", "The keeper"]
    assert "granite" in chunks[0].text and len(bytes(chunks[0].embedding)) == 384 * 4


def test_a_pdf_keeps_its_pages(alice, upload_ready):
    document = upload_ready(alice, "notes.pdf", pdf_bytes(["First page about herons.", "Second page about otters."]))
    assert document.status == Document.Status.READY, document.error
    assert [(c.page, c.text) for c in document.chunks.order_by("ordinal")] == [
        (1, "First page about herons."),
        (2, "Second page about otters."),
    ]


def test_docx_and_html_are_read_by_heading(alice, upload_ready):
    word = upload_ready(
        alice, "w.docx", docx_bytes([("Heading 1", "Tides"), ("Normal", "Spring tides follow the full moon.")])
    )
    page = upload_ready(
        alice, "p.html", "<html><head><script>evil()</script></head><body><h2>Bees</h2><p>Bees dance.</p></body></html>"
    )
    assert [(c.heading, c.text) for c in word.chunks.all()] == [("Tides", "Spring tides follow the full moon.")]
    assert [(c.heading, c.text) for c in page.chunks.all()] == [("Bees", "Bees dance.")]


@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("empty.txt", b"  \n", "empty_file"),
        ("picture.png", b"\x89PNG....", "unsupported_file_type"),
        ("fake.pdf", b"hello", "unsupported_file_type"),
        ("latin.txt", "caf\xe9".encode("latin-1"), "unreadable_file"),
        ("broken.docx", b"PK\x03\x04garbage", "unreadable_file"),
    ],
)
def test_bad_files_are_refused_with_a_clear_error_and_nothing_stored(alice, name, data, code):
    with pytest.raises(ClientError) as refused:
        document_upload(user=alice, name=name, data=data, library=True)
    assert refused.value.code == code and refused.value.status == 400
    assert not Document.objects.exists()


def test_an_encrypted_pdf_is_refused(alice):
    with pytest.raises(ClientError) as refused:
        document_upload(user=alice, name="secret.pdf", data=pdf_bytes(["x"], password="pw"), library=True)
    assert refused.value.code == "encrypted_file"
    assert "encrypted" in refused.value.message


def test_the_plans_size_and_count_limits_hold(alice):
    from accounts.models import Tier
    from documents.models import TierDocumentLimits

    tier = Tier.objects.get(name="free")
    assert alice.tier == tier
    # The plan's own row (a transactional test's flush removes the one the migration made).
    TierDocumentLimits.objects.update_or_create(
        tier=tier, defaults={"max_file_bytes": 100, "max_files": 2, "max_total_bytes": 150}
    )
    with pytest.raises(ClientError) as too_big:
        document_upload(user=alice, name="big.txt", data=b"x" * 101, library=True)
    assert too_big.value.code == "file_too_large" and too_big.value.status == 413
    document_upload(user=alice, name="a.txt", data=b"a" * 80, library=True)
    with pytest.raises(ClientError) as full:
        document_upload(user=alice, name="b.txt", data=b"b" * 80, library=True)
    assert full.value.code == "storage_full"
    document_upload(user=alice, name="c.txt", data=b"c" * 10, library=True)
    with pytest.raises(ClientError) as many:
        document_upload(user=alice, name="d.txt", data=b"d", library=True)
    assert many.value.code == "too_many_files"
    assert Document.objects.count() == 2


def test_deleting_a_file_or_its_owner_removes_its_chunks(alice, bob, upload_ready):
    first = upload_ready(alice, "h.md", HANDBOOK)
    upload_ready(bob, "h.md", HANDBOOK)
    assert Chunk.objects.filter(document=first).count() == 2
    document_delete(document=first)
    assert not Chunk.objects.filter(owner=alice).exists()
    bob.delete()
    assert not Chunk.objects.exists()


def test_retrieval_finds_the_passage_and_only_the_owners(alice, bob, upload_ready):
    upload_ready(alice, "handbook.md", HANDBOOK)
    upload_ready(bob, "other.md", "# Keeper\n\nBob's lighthouse keeper was called Angus Drummond.")
    found = retrieve_for_message(owner_id=alice.id, conversation_id=None, text="Who was the last keeper?")
    assert "Morag Fennimore" in found.passages[0].text
    assert all(p.file_name == "handbook.md" for p in found.passages)
    assert (
        retrieve_for_message(owner_id=bob.id, conversation_id=None, text="Morag Fennimore granite")
        .passages[0]
        .file_name
        == "other.md"
    )
