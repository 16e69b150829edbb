"""Images in a conversation's messages: the user's own image files a message carries, checked when it
is sent, judged by what they say (the text OCR read in them goes to input moderation with the
message), and shown to the model that answers: as images to a vision deployment (the newest
message's), as the text OCR read in them to any other, which is told that it cannot see them."""

from __future__ import annotations

from dataclasses import dataclass

from accounts.models import User
from chatsite.errors import ClientError
from conversations.models import Message, MessageImage
from documents.models import Document
from documents.selectors import images_for_user
from inference.engine.base import PromptImage


@dataclass(frozen=True)
class AttachedImage:
    id: int
    name: str
    ocr_text: str
    ocr_confidence: float | None
    content_type: str
    data: bytes

    def prompt_image(self) -> PromptImage:
        return PromptImage(self.content_type, self.data)


def message_images_resolve(*, user: User, ids: tuple[int, ...]) -> list[AttachedImage]:
    """The images a message is to carry: each the user's own image, read (its text is known), or a
    clear refusal. Another user's image is refused exactly as a missing one."""
    if not ids:
        return []
    if len(set(ids)) != len(ids):
        raise ClientError("An image is listed twice in 'images'.", code="invalid_request", param="images")
    found = images_for_user(user=user, ids=list(ids), with_data=True)
    if len(found) != len(ids):
        raise ClientError("That image does not exist.", code="not_found", status=404, param="images")
    for document in found:
        if document.status == Document.Status.FAILED:
            raise ClientError(
                f"The image {document.name} could not be read: {document.error}", code="invalid_image", param="images"
            )
        if document.status != Document.Status.READY:
            raise ClientError(
                f"The image {document.name} is still being read. Send the message once it is ready.",
                code="image_not_ready",
                status=409,
                param="images",
            )
    return [AttachedImage(d.id, d.name, d.ocr_text, d.ocr_confidence, d.content_type, bytes(d.data)) for d in found]


def text_with_images(content: str, images: list[AttachedImage]) -> str:
    """What input moderation judges: the message and what its images say."""
    return "\n\n".join([content, *(image.ocr_text for image in images if image.ocr_text)])


def image_block(*, name: str, ocr_text: str, confidence: float | None) -> str:
    """An image as a text-only model gets it: said to be an image it cannot see, with the text OCR
    read in it, quoted a line at a time."""
    sure = f", confidence {confidence:.0f}%" if confidence is not None else ""
    if not ocr_text.strip():
        return f'[Image "{name}": you cannot see images, and OCR found no text in this one.]'
    quoted = "\n".join(f"| {line}" for line in ocr_text.splitlines())
    return f'[Image "{name}": you cannot see images; this is the text read from it by OCR{sure}:]\n{quoted}'


def content_with_image_text(content: str, blocks: list[str]) -> str:
    return "\n\n".join([content, *blocks]) if blocks else content


def message_images_link(*, message: Message, images: list[AttachedImage], sent_as: str) -> None:
    MessageImage.objects.bulk_create(
        MessageImage(message=message, document_id=image.id, ordinal=i, sent_as=sent_as)
        for i, image in enumerate(images)
    )


def image_blocks_of(*, message_ids: list[int]) -> dict[int, list[str]]:
    """The text form of each listed message's images, by message (for turns before the newest)."""
    blocks: dict[int, list[str]] = {}
    links = (
        MessageImage.objects.filter(message_id__in=message_ids)
        .select_related("document")
        .only("message_id", "document__name", "document__ocr_text", "document__ocr_confidence")
    )
    for link in links:
        document = link.document
        blocks.setdefault(link.message_id, []).append(
            image_block(name=document.name, ocr_text=document.ocr_text, confidence=document.ocr_confidence)
        )
    return blocks


def images_shown(*, message_ids: list[int]) -> dict[int, list[dict[str, object]]]:
    """Each message's images as the page and the API show them: a thumbnail to load (their owner's
    only), what OCR read, and whether the model saw the image or its text."""
    shown: dict[int, list[dict[str, object]]] = {}
    links = (
        MessageImage.objects.filter(message_id__in=message_ids)
        .select_related("document")
        .defer("document__data", "document__thumbnail")
    )
    for link in links:
        document = link.document
        shown.setdefault(link.message_id, []).append(
            {
                "id": document.id,
                "name": document.name,
                "thumbnail_url": f"/api/files/{document.id}/thumbnail/",
                "image_url": f"/api/files/{document.id}/image/",
                "ocr_text": document.ocr_text,
                "ocr_confidence": document.ocr_confidence,
                "sent_as": link.sent_as,
            }
        )
    return shown
