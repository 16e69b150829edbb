"""Images made for a test: text drawn large and clear (DejaVu Sans where the machine has it, else
Pillow's own font scaled), so OCR reads it back; a PDF of such a page with no text layer (a scan); and
the hostile kinds: a decompression bomb, a file cut short, a file that lies about its type."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

FONT_FILES = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
]


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    for path in FONT_FILES:
        if Path(path).is_file():
            return ImageFont.truetype(path, size)
    return ImageFont.load_default(size=size)


def text_image(lines: list[str] | str, *, size: int = 44, mode: str = "RGB") -> Image.Image:
    """Black text on white, a line each, large enough for OCR to read without doubt."""
    lines = [lines] if isinstance(lines, str) else lines
    font = _font(size)
    width = max(int(font.getlength(line)) for line in lines) + 80
    image = Image.new(mode, (width, (size + 20) * len(lines) + 60), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((40, 30 + i * (size + 20)), line, fill="black", font=font)
    return image


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    if fmt == "JPEG" and image.mode != "RGB":
        image = image.convert("RGB")
    image.save(out, fmt, **options)
    return out.getvalue()


def with_gps_exif(image: Image.Image) -> bytes:
    """A JPEG carrying a camera's name and a GPS position in its EXIF."""
    exif = Image.Exif()
    exif[0x010F] = "SecretCameraMaker"
    exif[0x8825] = {1: "N", 2: (51.0, 30.0, 12.34), 3: "W", 4: (0.0, 7.0, 39.0)}
    return encoded(image, "JPEG", exif=exif)


def scanned_pdf(lines: list[str] | str) -> bytes:
    """A PDF whose one page is a picture of the text: no text layer, as a scanner makes it."""
    return encoded(text_image(lines).convert("L"), "PDF", resolution=150)


def pixel_bomb(side: int = 20_000) -> bytes:
    """A small PNG (tens of KB) that decodes to `side` × `side` pixels."""
    return encoded(Image.new("1", (side, side)), "PNG")


def cut_short(data: bytes) -> bytes:
    return data[: len(data) // 2]


def tesseract_missing() -> bool:
    return shutil.which("tesseract") is None


# Tests that need OCR: in CI Tesseract must be there (`make test` installs it), so a missing one fails
# them there; elsewhere they are skipped, saying why.
needs_tesseract = pytest.mark.skipif(
    tesseract_missing() and not os.environ.get("CI"),
    reason="Tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng; make test does it)",
)
