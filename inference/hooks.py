"""What inference needs from the apps above it, which it cannot import: each registers its answer at
start-up (its `AppConfig.ready`), and inference calls what is registered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from accounts.models import User


@dataclass(frozen=True)
class ImageRead:
    """An image as the service keeps it (cleaned: its pixels only) and the text OCR read in it."""

    content_type: str
    data: bytes
    text: str
    confidence: float | None


class ImageReader(Protocol):
    """Clean an image within `user`'s plan and read its text; a ClientError for one it does not take."""

    def __call__(self, *, user: User, data: bytes) -> ImageRead: ...


_image_reader: list[ImageReader] = []


def image_reader_register(reader: ImageReader) -> None:
    """Have `image_read` answer with `reader` (documents', at start-up)."""
    _image_reader[:] = [reader]


def image_read(*, user: User, data: bytes) -> ImageRead:
    if not _image_reader:
        raise RuntimeError("no image reader registered: DocumentsConfig.ready registers it")
    return _image_reader[0](user=user, data=data)
