from __future__ import annotations

import io
import time
from typing import Any

import pytest

from documents.models import Document
from documents.services import document_process, document_upload


def pdf_bytes(pages: list[str], *, password: str | None = None) -> bytes:
    """A real PDF whose pages carry `pages`' text (pypdf writes it; one line per text line)."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    font = writer._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )
    for text in pages:
        page = writer.add_blank_page(width=612, height=792)
        lines = []
        for i, line in enumerate(text.splitlines() or [""]):
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            lines.append(f"BT /F1 10 Tf 40 {750 - 14 * i} Td ({escaped}) Tj ET")
        stream = DecodedStreamObject()
        stream.set_data("\n".join(lines).encode("latin-1"))
        page[NameObject("/Contents")] = writer._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
    if password:
        writer.encrypt(password)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def docx_bytes(paragraphs: list[tuple[str, str]]) -> bytes:
    """A Word document of (style, text) paragraphs: "Heading 1" or "Normal"."""
    import docx

    document = docx.Document()
    for style, text in paragraphs:
        if style.startswith("Heading"):
            document.add_heading(text, level=int(style.split()[-1]))
        else:
            document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


@pytest.fixture
def upload_ready():
    """Upload a file into the library (or a conversation) and process it here, as the background would."""

    def upload(user: Any, name: str, data: bytes | str, **where: Any) -> Document:
        if isinstance(data, str):
            data = data.encode()
        if not where:
            where = {"library": True}
        document = document_upload(user=user, name=name, data=data, **where)
        # The embedded default's background may have claimed it first (a slow file, OCR): then this
        # waits for that run to end, as the background's own retry of "busy" and "running" would.
        deadline = time.monotonic() + 120
        while document_process(document_id=document.id) in ("busy", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
        document.refresh_from_db()
        return document

    return upload
