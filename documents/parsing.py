"""From a file's bytes to passages: what kind of file it is, whether it can be read, its text with
where each part was (page, heading), and the chunks that get embedded.

Checked at upload, cheaply, so a bad file is a 400 there: the type (by extension, confirmed by the
bytes), emptiness, text that is not UTF-8, a PDF that is encrypted or unreadable, a DOCX that is no
Word document. Extraction and chunking run later, in the background.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath

from chatsite.errors import ClientError

EXTENSIONS = {
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".pdf": "pdf",
    ".html": "html",
    ".htm": "html",
    ".docx": "docx",
}
# A chunk's target size: all-MiniLM reads 256 word pieces, about 1,000 characters of English.
CHUNK_CHARS = 800
CHUNK_OVERLAP = 120
_SPACES = re.compile(r"[ \t\r\f\v]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")
_MARKDOWN_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


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
    if kind == "docx" and not head.startswith(b"PK"):
        raise bad_file("This file is named .docx but is not a Word document.", "unsupported_file_type")
    if kind in ("text", "markdown", "html") and (head.startswith(b"%PDF-") or head.startswith(b"PK\x03\x04")):
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


# --- extraction ------------------------------------------------------------------------------------


def extract(kind: str, data: bytes) -> list[Section]:
    """The file's text, in order, cut where its page or heading changes."""
    if kind == "pdf":
        return _pdf(data)
    if kind == "docx":
        return _docx(data)
    text = data.decode("utf-8-sig")
    if kind == "html":
        return _html(text)
    if kind == "markdown":
        return _markdown(text)
    return [Section(text)]


def _pdf(data: bytes) -> list[Section]:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    return [Section(page.extract_text() or "", page=number) for number, page in enumerate(reader.pages, start=1)]


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
