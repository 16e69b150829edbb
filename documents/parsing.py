"""From a file's bytes to passages: what kind of file it is, whether it can be read, its text with
where each part was (page, heading), and the chunks that get embedded.

Checked at upload, cheaply, so a bad file is a 400 there: the type (by extension, confirmed by the
bytes), emptiness, text that is not UTF-8, a PDF that is encrypted or unreadable, a DOCX that is no
Word document. Extraction and chunking run later, in the background, under the plan's bounds
(`ParseLimits`): a file over one fails with `TooLarge` and a reason its owner can read, found before
the expensive step it would have made expensive (the archive's directory before any part is read,
the page count before any page, the paragraphs before python-docx builds one object for each).
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath

from chatsite.errors import ClientError
from documents.imaging import (
    IMAGE_EXTENSIONS,
    ImageRefused,
    OcrUnavailable,
    Reading,
    decode,
    image_format,
    ocr,
    ocr_note,
)

EXTENSIONS = {
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".pdf": "pdf",
    ".html": "html",
    ".htm": "html",
    ".docx": "docx",
    **{suffix: "image" for suffix in IMAGE_EXTENSIONS},
}
# A scanned page is rendered for OCR at this resolution, or less where the plan's pixel bound says so.
SCAN_DPI = 300
# A chunk's target size: all-MiniLM reads 256 word pieces, about 1,000 characters of English.
CHUNK_CHARS = 800
CHUNK_OVERLAP = 120
_SPACES = re.compile(r"[ \t\r\f\v]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")
_MARKDOWN_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
# An archive's part this large that is this many times its packed size is a compression bomb, not a
# document: Word's own XML packs 5 to 20 times, a picture about once. Small parts may pack further
# (a run of empty paragraphs) and cost nothing; the plan's unpacked size bounds them together.
MAX_COMPRESSION_RATIO = 100
RATIO_CHECKED_BYTES = 1024 * 1024
# A paragraph of WordprocessingML (<w:p>, <w:p/>, <w:p w:rsidR=...>), any prefix; not <w:pPr>.
_DOCX_PARAGRAPH = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?p[\s/>]")
_READ_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class Section:
    """A run of text with one position: its page (PDF) and the heading it sits under."""

    text: str
    page: int | None = None
    heading: str = ""


@dataclass(frozen=True)
class Passage:
    text: str
    page: int | None
    heading: str


@dataclass(frozen=True)
class ParseLimits:
    """A plan's bounds on what one file may make; None means no limit."""

    max_unpacked_bytes: int | None = None
    max_pages: int | None = None
    max_paragraphs: int | None = None
    max_chunks: int | None = None
    # Every plan has one: an image, or a scanned page rendered for OCR, decodes to at most this many.
    max_image_pixels: int = 25_000_000


@dataclass(frozen=True)
class Parsed:
    passages: list[Passage]
    pages: int
    # What OCR read (an image, a PDF's scanned pages): the pages it read, its text and confidence.
    ocr_pages: int = 0
    ocr_text: str = ""
    ocr_confidence: float | None = None


class TooLarge(Exception):
    """The file is over one of its plan's bounds; the message says which, for its owner."""


def megabytes(size: float) -> str:
    return f"{size / (1024 * 1024):,.1f} MB"


def bad_file(message: str, code: str = "invalid_file") -> ClientError:
    return ClientError(message, code=code, param="file")


def kind_of(name: str, head: bytes) -> str:
    """The file's kind from its name, confirmed by its first bytes; a 400 for anything else."""
    suffix = PurePath(name).suffix.lower()
    kind = EXTENSIONS.get(suffix)
    if kind is None:
        known = ", ".join(sorted({s.lstrip(".") for s in EXTENSIONS}))
        raise bad_file(f"Files of this type cannot be read here. Upload one of: {known}.", "unsupported_file_type")
    if kind == "pdf" and not head.startswith(b"%PDF-"):
        raise bad_file("This file is named .pdf but is not a PDF.", "unsupported_file_type")
    if kind == "image" and image_format(head) is None:
        raise bad_file("This file is named as an image but is not a PNG, JPEG, WebP or GIF.", "unsupported_file_type")
    if kind == "docx" and not head.startswith(b"PK"):
        raise bad_file("This file is named .docx but is not a Word document.", "unsupported_file_type")
    if kind in ("text", "markdown", "html") and (
        head.startswith(b"%PDF-") or head.startswith(b"PK\x03\x04") or image_format(head) is not None
    ):
        raise bad_file("This file's name says text, but its contents are binary.", "unsupported_file_type")
    return kind


def check_readable(kind: str, data: bytes) -> None:
    """A 400 for a file that cannot be read: empty, not UTF-8, encrypted, damaged."""
    if not data.strip():
        raise bad_file("The file is empty.", "empty_file")
    if kind in ("text", "markdown", "html"):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise bad_file("The file is not UTF-8 text.", "unreadable_file") from None
        if "\x00" in text:
            raise bad_file("The file contains NUL characters: it is not a text file.", "unreadable_file")
    elif kind == "pdf":
        from pypdf import PdfReader
        from pypdf.errors import PyPdfError

        try:
            reader = PdfReader(io.BytesIO(data))
            encrypted = reader.is_encrypted
            pages = 0 if encrypted else len(reader.pages)
        except (PyPdfError, ValueError, KeyError, TypeError, OSError):
            raise bad_file("The PDF is damaged and cannot be read.", "unreadable_file") from None
        if encrypted:
            raise bad_file("The PDF is encrypted. Upload a copy without a password.", "encrypted_file")
        if pages == 0:
            raise bad_file("The PDF has no pages.", "empty_file")
    elif kind == "docx":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                names = set(archive.namelist())
        except zipfile.BadZipFile:
            raise bad_file("The Word document is damaged and cannot be read.", "unreadable_file") from None
        if "EncryptionInfo" in names or "EncryptedPackage" in names:
            raise bad_file("The Word document is encrypted. Upload a copy without a password.", "encrypted_file")
        if "word/document.xml" not in names:
            raise bad_file("This file is not a Word (DOCX) document.", "unreadable_file")


# --- the plan's bounds -----------------------------------------------------------------------------


def parse(kind: str, data: bytes, limits: ParseLimits) -> Parsed:
    """Extract and chunk a file within `limits`, or raise TooLarge before the step a bound is for."""
    if kind == "docx":
        archive_check(data, limits)
        docx_paragraphs_check(data, limits)
    elif kind == "pdf":
        pdf_pages_check(data, limits)
    if kind == "image":
        return _image(data, limits)
    readings: list[Reading] = []
    sections = extract(kind, data, limits, readings)
    if limits.max_paragraphs is not None:
        count = sum(len(_BLANK_LINES.split(s.text)) for s in sections)
        if count > limits.max_paragraphs:
            raise TooLarge(_too_many_paragraphs(limits.max_paragraphs))
    found = passages(sections)
    if limits.max_chunks is not None and len(found) > limits.max_chunks:
        raise TooLarge(
            f"This file makes more than {limits.max_chunks:,} passages ({len(found):,}); your plan indexes "
            f"up to {limits.max_chunks:,} passages of one file. Split it into smaller files."
        )
    return Parsed(
        found,
        max((s.page or 0 for s in sections), default=0),
        ocr_pages=len(readings),
        ocr_text="\n\n".join(r.text for r in readings if r.text),
        ocr_confidence=_mean_confidence(readings),
    )


def _mean_confidence(readings: list[Reading]) -> float | None:
    read = [(r.confidence, len(r.text)) for r in readings if r.confidence is not None and r.text]
    total = sum(length for _, length in read)
    return round(sum(c * length for c, length in read) / total, 1) if total else None


def _image(data: bytes, limits: ParseLimits) -> Parsed:
    """An image's text, read by OCR: one section, its heading saying so and how sure it is."""
    try:
        reading = ocr(decode(data, max_pixels=limits.max_image_pixels))
    except (ImageRefused, OcrUnavailable) as exc:
        raise TooLarge(str(exc)) from None
    found = passages([Section(reading.text, heading=ocr_note(reading.confidence))])
    return Parsed(found, 0, ocr_pages=1, ocr_text=reading.text, ocr_confidence=reading.confidence)


def archive_check(data: bytes, limits: ParseLimits) -> None:
    """An archive's parts, from its directory alone (nothing unpacked): their sizes together within
    the plan's, and no large part packed more than MAX_COMPRESSION_RATIO times. zipfile stops
    unpacking a part at the size its directory declares, so a part that lies unpacks no further."""
    total = 0
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            total += info.file_size
            ratio = info.file_size / max(1, info.compress_size)
            if info.file_size >= RATIO_CHECKED_BYTES and ratio > MAX_COMPRESSION_RATIO:
                raise TooLarge(
                    f"This file's part {info.filename[:100]} unpacks to {megabytes(info.file_size)}, "
                    f"{ratio:,.0f} times its packed size (more than {MAX_COMPRESSION_RATIO} times): it was not "
                    "opened, since a document does not pack that tightly."
                )
    if limits.max_unpacked_bytes is not None and total > limits.max_unpacked_bytes:
        raise TooLarge(
            f"This file unpacks to more than {megabytes(limits.max_unpacked_bytes)} ({megabytes(total)}), "
            "your plan's limit for one file."
        )


def docx_paragraphs_check(data: bytes, limits: ParseLimits) -> None:
    """Count the document's paragraphs in its XML, a block at a time, before python-docx makes an
    object (and a style lookup) of each: a million empty ones take it an hour."""
    if limits.max_paragraphs is None:
        return
    count, tail = 0, b""
    with zipfile.ZipFile(io.BytesIO(data)) as archive, archive.open("word/document.xml") as xml:
        while block := xml.read(_READ_BLOCK):
            text = tail + block
            # The last bytes go again with the next block: a tag cut in two is counted there, once.
            cut = max(0, len(text) - 64)
            count += sum(1 for match in _DOCX_PARAGRAPH.finditer(text) if match.start() < cut)
            tail = text[cut:]
            if count > limits.max_paragraphs:
                raise TooLarge(_too_many_paragraphs(limits.max_paragraphs))
        count += len(_DOCX_PARAGRAPH.findall(tail))
    if count > limits.max_paragraphs:
        raise TooLarge(_too_many_paragraphs(limits.max_paragraphs))


def pdf_pages_check(data: bytes, limits: ParseLimits) -> None:
    if limits.max_pages is None:
        return
    from pypdf import PdfReader

    pages = len(PdfReader(io.BytesIO(data)).pages)
    if pages > limits.max_pages:
        raise TooLarge(
            f"This PDF has more than {limits.max_pages:,} pages ({pages:,}); your plan reads PDFs of up to "
            f"{limits.max_pages:,} pages."
        )


def _too_many_paragraphs(limit: int) -> str:
    return f"This file has more than {limit:,} paragraphs; your plan reads up to {limit:,} paragraphs of one file."


# --- extraction ------------------------------------------------------------------------------------


def extract(
    kind: str, data: bytes, limits: ParseLimits | None = None, readings: list[Reading] | None = None
) -> list[Section]:
    """The file's text, in order, cut where its page or heading changes. A PDF page with no text
    (scanned) is read by OCR, its reading added to `readings`."""
    if kind == "pdf":
        return _pdf(data, limits or ParseLimits(), readings if readings is not None else [])
    if kind == "docx":
        return _docx(data)
    text = data.decode("utf-8-sig")
    if kind == "html":
        return _html(text)
    if kind == "markdown":
        return _markdown(text)
    return [Section(text)]


def _pdf(data: bytes, limits: ParseLimits, readings: list[Reading]) -> list[Section]:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    sections = []
    for number, page in enumerate(reader.pages, start=1):
        text = page.extract_text() or ""
        if text.strip():
            sections.append(Section(text, page=number))
            continue
        reading = _scanned_page(data, number - 1, limits)
        readings.append(reading)
        sections.append(Section(reading.text, page=number, heading=ocr_note(reading.confidence, page=True)))
    return sections


def _scanned_page(data: bytes, index: int, limits: ParseLimits) -> Reading:
    """A page with no text layer, rendered by PDFium and read by OCR. PDFium draws the page as a
    viewer shows it (every image on it, in any of PDF's codecs, clipped and placed), which the page's
    embedded images alone are not; at SCAN_DPI, or less where the plan's pixel bound says so."""
    import math

    import pypdfium2

    document = pypdfium2.PdfDocument(data)
    try:
        page = document[index]
        width, height = page.get_size()  # points: 1/72 inch
        scale = min(SCAN_DPI / 72, math.sqrt(limits.max_image_pixels / max(1.0, width * height)))
        image = page.render(scale=scale, grayscale=True).to_pil()
    finally:
        document.close()
    try:
        return ocr(image)
    except OcrUnavailable as exc:
        raise TooLarge(str(exc)) from None


def _docx(data: bytes) -> list[Section]:
    import docx

    document = docx.Document(io.BytesIO(data))
    sections: list[Section] = []
    heading = ""
    lines: list[str] = []
    for paragraph in document.paragraphs:
        style = (paragraph.style.name if paragraph.style is not None else "") or ""
        if style.lower().startswith(("heading", "title")) and paragraph.text.strip():
            sections.append(Section("\n\n".join(lines), heading=heading))
            heading, lines = paragraph.text.strip()[:300], []
        else:
            lines.append(paragraph.text)
    for table in document.tables:
        for row in table.rows:
            lines.append(" | ".join(cell.text for cell in row.cells))
    sections.append(Section("\n\n".join(lines), heading=heading))
    return sections


def _markdown(text: str) -> list[Section]:
    sections: list[Section] = []
    heading = ""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else _MARKDOWN_HEADING.match(line)
        if match:
            sections.append(Section("\n".join(lines), heading=heading))
            heading, lines = match.group(2)[:300], []
        else:
            lines.append(line)
    sections.append(Section("\n".join(lines), heading=heading))
    return sections


class _HtmlText(HTMLParser):
    """The text of an HTML page, by heading; scripts, styles and templates left out."""

    SKIP = {"script", "style", "template", "noscript", "head", "svg"}
    BLOCKS = {"p", "div", "li", "br", "tr", "section", "article", "blockquote", "pre", "table", "ul", "ol"}
    HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[Section] = []
        self.heading = ""
        self.parts: list[str] = []
        self.skipping = 0
        self.in_heading: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.HEADINGS:
            self.in_heading = []
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.HEADINGS and self.in_heading is not None:
            self.sections.append(Section("".join(self.parts), heading=self.heading))
            self.heading = " ".join("".join(self.in_heading).split())[:300]
            self.parts, self.in_heading = [], None
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self.skipping:
            return
        (self.in_heading if self.in_heading is not None else self.parts).append(data)

    def result(self) -> list[Section]:
        self.close()
        return [*self.sections, Section("".join(self.parts), heading=self.heading)]


def _html(text: str) -> list[Section]:
    parser = _HtmlText()
    parser.feed(text)
    return parser.result()


# --- chunking --------------------------------------------------------------------------------------


def passages(sections: list[Section], *, size: int = CHUNK_CHARS, overlap: int = CHUNK_OVERLAP) -> list[Passage]:
    """Chunks of about `size` characters, cut at paragraph ends where possible (else at a space),
    never across a page or heading; a paragraph longer than `size` is cut with `overlap`."""
    found: list[Passage] = []
    for section in sections:
        paragraphs = [_SPACES.sub(" ", p).strip() for p in _BLANK_LINES.split(section.text)]
        current = ""
        for paragraph in (p for p in paragraphs if p):
            for piece in _pieces(paragraph, size, overlap):
                if current and len(current) + 2 + len(piece) > size:
                    found.append(Passage(current, section.page, section.heading))
                    current = ""
                current = f"{current}\n\n{piece}" if current else piece
        if current:
            found.append(Passage(current, section.page, section.heading))
    return found


def _pieces(paragraph: str, size: int, overlap: int) -> list[str]:
    if len(paragraph) <= size:
        return [paragraph]
    pieces, start = [], 0
    while start < len(paragraph):
        end = min(start + size, len(paragraph))
        if end < len(paragraph):
            space = paragraph.rfind(" ", start + size // 2, end)
            end = space if space > 0 else end
        pieces.append(paragraph[start:end].strip())
        if end >= len(paragraph):
            break
        start = max(end - overlap, start + 1)
    return [p for p in pieces if p]
