"""Images: what kind one is (from its bytes), decoding it safely, a clean copy without its metadata,
a thumbnail, and the text in it read by Tesseract OCR.

Everything here that decodes runs in the bounded child process (`documents.sandbox`), never in a web
process: a picture is small on the wire and may be huge inside (a 20 KB PNG can declare 50,000 ×
50,000 pixels), and its decoders are C code that never looks at a clock. Pillow's own guard,
`Image.MAX_IMAGE_PIXELS`, is set to the plan's bound and its warning made an error, so an image over
the bound is refused from its header, before a pixel is decoded; the child's memory cap and the
deadline stop anything else.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import warnings
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

# Formats taken, by the first bytes; GIF and WebP animations are read at their first frame.
CONTENT_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".gif"}
THUMBNAIL_SIDE = 320
# Tesseract reads text of 20-30 pixels' height best: smaller images (screenshots) are enlarged first.
OCR_MIN_SIDE = 1600
OCR_SECONDS = 60


def image_format(head: bytes) -> str | None:
    """The format the bytes open with ("PNG", "JPEG", "WEBP", "GIF"), or None for anything else."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


class ImageRefused(Exception):
    """The image cannot be taken; `code` and the message are for its sender."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class CleanImage:
    """An image decoded and encoded again: its pixels only (no EXIF, GPS, comments or profiles)."""

    data: bytes
    content_type: str
    width: int
    height: int
    thumbnail: bytes


@dataclass(frozen=True)
class Reading:
    """Text Tesseract read, and its mean word confidence (0-100; None when it read no word)."""

    text: str
    confidence: float | None


def decode(data: bytes, *, max_pixels: int) -> Image.Image:
    """The first frame of an image of a taken format, decoded, or ImageRefused. Over `max_pixels`
    it is refused from its header: nothing is decoded."""
    Image.MAX_IMAGE_PIXELS = max_pixels
    with warnings.catch_warnings():
        # Pillow warns past MAX_IMAGE_PIXELS and refuses past twice it: both are a refusal here.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            opened = Image.open(io.BytesIO(data), formats=list(CONTENT_TYPES))
            width, height = opened.size
            if width * height > max_pixels:
                raise Image.DecompressionBombError("over the bound")
            opened.seek(0)
            opened.load()
            # The orientation EXIF asks for, applied before the EXIF goes: the picture stays upright.
            image = ImageOps.exif_transpose(opened)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageRefused(
                f"This image has more pixels than your plan takes ({max_pixels:,}).", "image_too_large"
            ) from None
        except UnidentifiedImageError:
            if image_format(data[:16]) is not None:  # it starts as one, but is not a whole one
                raise ImageRefused("The image is damaged and cannot be read.", "unreadable_file") from None
            raise ImageRefused("This file is not a PNG, JPEG, WebP or GIF image.", "unsupported_file_type") from None
        except (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error):
            raise ImageRefused("The image is damaged or cut short and cannot be read.", "unreadable_file") from None
    return image


def clean(data: bytes, *, max_pixels: int) -> CleanImage:
    """A copy of the image made from its pixels alone, in its own format (a GIF's first frame and
    anything with a palette as PNG), and a thumbnail (JPEG, at most THUMBNAIL_SIDE a side)."""
    image = decode(data, max_pixels=max_pixels)
    source = (image.format or "").upper() or (image_format(data[:16]) or "PNG")
    if source == "JPEG":
        pixels, out_format = image.convert("RGB"), "JPEG"
    else:
        mode = "RGBA" if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info else "RGB"
        pixels, out_format = image.convert(mode), ("WEBP" if source == "WEBP" else "PNG")
    # A new image from the pixels: nothing of the file's info (EXIF, XMP, ICC, text chunks) comes along.
    fresh = Image.frombytes(pixels.mode, pixels.size, pixels.tobytes())
    out = io.BytesIO()
    if out_format == "JPEG":
        fresh.save(out, "JPEG", quality=90)
    elif out_format == "WEBP":
        fresh.save(out, "WEBP", quality=90)
    else:
        fresh.save(out, "PNG", optimize=False)
    return CleanImage(out.getvalue(), CONTENT_TYPES[out_format], fresh.width, fresh.height, thumbnail(fresh))


def thumbnail(image: Image.Image) -> bytes:
    small = image.copy()
    small.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
    if small.mode != "RGB":
        # Transparency on white, as the page shows it.
        flat = Image.new("RGB", small.size, "white")
        flat.paste(small, mask=small.getchannel("A") if "A" in small.getbands() else None)
        small = flat
    out = io.BytesIO()
    small.save(out, "JPEG", quality=80)
    return out.getvalue()


def ocr(image: Image.Image, *, seconds: float = OCR_SECONDS) -> Reading:
    """The text Tesseract reads in a decoded image, line by line, with its mean word confidence.

    Tesseract is given a grey PNG this code made (never the sender's file), on its standard input, and
    answers in TSV: one row per word with its confidence. It runs with one thread (OMP_THREAD_LIMIT),
    inside the child's memory cap (a child process inherits its limits) and under a deadline."""
    grey = image.convert("L")
    side = max(grey.size)
    if side < OCR_MIN_SIDE:
        factor = min(4, OCR_MIN_SIDE // max(1, side))
        if factor >= 2:
            grey = grey.resize((grey.width * factor, grey.height * factor), Image.Resampling.LANCZOS)
    png = io.BytesIO()
    grey.save(png, "PNG")
    try:
        done = subprocess.run(
            ["tesseract", "stdin", "stdout", "-l", "eng", "--psm", "3", "tsv"],
            input=png.getvalue(),
            capture_output=True,
            timeout=seconds,
            env={**os.environ, "OMP_THREAD_LIMIT": "1"},
            check=False,
        )
    except FileNotFoundError:
        raise OcrUnavailable("Tesseract is not installed: text in images cannot be read.") from None
    except subprocess.TimeoutExpired:
        raise OcrUnavailable(f"Reading the text in this image took longer than {seconds:g} seconds.") from None
    if done.returncode != 0:
        raise OcrUnavailable("Tesseract could not read this image.")
    return reading_from_tsv(done.stdout.decode("utf-8", "replace"))


class OcrUnavailable(Exception):
    """OCR could not run (no Tesseract, over time); the message is for the file's owner."""


def reading_from_tsv(tsv: str) -> Reading:
    """Tesseract's TSV as text (a line per line it found, a blank line between paragraphs) and the
    mean confidence of its words, each weighted by its length."""
    lines: dict[tuple[int, int, int, int], list[str]] = {}
    weighted = total = 0.0
    for row in tsv.splitlines()[1:]:
        cells = row.split("\t")
        if len(cells) < 12 or cells[0] != "5":
            continue
        word = cells[11].strip()
        try:
            confidence = float(cells[10])
        except ValueError:
            continue
        if not word or confidence < 0:
            continue
        key = (int(cells[1]), int(cells[2]), int(cells[3]), int(cells[4]))
        lines.setdefault(key, []).append(word)
        weighted += confidence * len(word)
        total += len(word)
    text, last_paragraph = [], None
    for (page, block, paragraph, _), words in lines.items():
        if last_paragraph is not None and last_paragraph != (page, block, paragraph):
            text.append("")
        text.append(" ".join(words))
        last_paragraph = (page, block, paragraph)
    return Reading("\n".join(text).strip(), round(weighted / total, 1) if total else None)


def read(data: bytes, *, max_pixels: int) -> tuple[CleanImage, Reading]:
    """Clean an image and read its text: what a request's image needs before it goes to a model."""
    cleaned = clean(data, max_pixels=max_pixels)
    return cleaned, ocr(decode(cleaned.data, max_pixels=max_pixels))


def ocr_note(confidence: float | None, *, page: bool = False) -> str:
    """What a passage read by OCR says of itself (its heading, shown with it and quoted with it)."""
    where = "the scanned page" if page else "the image"
    return (
        f"Read from {where} by OCR (confidence {confidence:.0f}%)"
        if confidence is not None
        else f"Read from {where} by OCR"
    )
