from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models


class Document(models.Model):
    """A file a user uploaded: into one conversation (`conversation_id`), one project (`project_id`:
    every chat in it), or into their library (`library`), which every conversation of theirs draws
    on. Its bytes are kept in the row, so a worker on another host processes it from the database
    alone; its chunks go when it goes."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        PROCESSING = "processing"
        READY = "ready"
        FAILED = "failed"

    class Kind(models.TextChoices):
        TEXT = "text", "Plain text"
        MARKDOWN = "markdown", "Markdown"
        PDF = "pdf", "PDF"
        HTML = "html", "HTML"
        DOCX = "docx", "Word (DOCX)"
        IMAGE = "image", "Image"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="documents")
    # The conversation it was attached to (none for a library file) is kept by conversations, the
    # layer above, pointing down here (conversations.ConversationFile): `Document.objects.filter(
    # conversation=...)` and `document.conversation_link` read it, and a conversation deleted takes
    # its files with it.
    library = models.BooleanField(default=False, help_text="In its owner's library: used by every conversation.")
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    size = models.PositiveBigIntegerField(help_text="Bytes, as uploaded.")
    sha256 = models.CharField(max_length=64)
    data = models.BinaryField(editable=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.PositiveSmallIntegerField(default=0, help_text="Per cent of the processing done.")
    error = models.TextField(blank=True, default="", help_text="Why processing failed, for its owner.")
    pages = models.PositiveIntegerField(default=0)
    chunk_count = models.PositiveIntegerField(default=0)
    withheld_count = models.PositiveIntegerField(
        default=0, help_text="Chunks the prompt-injection check held back: never put into a prompt."
    )
    # An image's: kept as its pixels alone (encoded again, no metadata), its type and size as stored,
    # and a small JPEG to show in the conversation.
    content_type = models.CharField(max_length=32, blank=True, default="")
    width = models.PositiveIntegerField(default=0)
    height = models.PositiveIntegerField(default=0)
    thumbnail = models.BinaryField(editable=False, blank=True, default=b"")
    # What OCR read: an image's text, or a PDF's scanned pages' (those with no text of their own).
    ocr_pages = models.PositiveIntegerField(default=0, help_text="Pages (or the image) whose text OCR read.")
    ocr_text = models.TextField(blank=True, default="", help_text="The text OCR read, as read.")
    ocr_confidence = models.FloatField(
        null=True, blank=True, help_text="Tesseract's mean word confidence (0-100) over what it read."
    )
    usage_charged = models.BooleanField(
        default=False, help_text="Its processing's tokens are on its owner's ledger (charged once, never again)."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "status"]),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_ready(self) -> bool:
        return self.status == self.Status.READY

    @property
    def is_image(self) -> bool:
        return self.kind == self.Kind.IMAGE

    @property
    def conversation_id(self) -> int | None:
        """The conversation it was attached to, None for a library file (read with
        `select_related("conversation_link")` where many are listed)."""
        link = getattr(self, "conversation_link", None)
        return link.conversation_id if link is not None else None

    @property
    def project_id(self) -> int | None:
        """The project it was uploaded into (conversations.ProjectFile), None for any other file."""
        link = getattr(self, "project_link", None)
        return link.project_id if link is not None else None


class Chunk(models.Model):
    """A passage of a document, where it was (page, heading), and its sentence embedding (float32
    little-endian bytes, unit length). `owner` repeats the document's, so every search filters on
    one indexed column. Flagged chunks (`injection`) stay for the owner to see, never for a prompt."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    ordinal = models.PositiveIntegerField()
    page = models.PositiveIntegerField(null=True, blank=True)
    heading = models.CharField(max_length=300, blank=True, default="")
    text = models.TextField()
    embedding = models.BinaryField()
    injection = models.BooleanField(default=False, help_text="The prompt-injection check flagged it.")

    class Meta:
        ordering = ["document_id", "ordinal"]
        indexes = [models.Index(fields=["owner", "document"])]
        constraints = [models.UniqueConstraint(fields=["document", "ordinal"], name="chunk_ordinal_unique")]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.ordinal}"


class TierDocumentLimits(models.Model):
    """What a plan allows in files, and how much of the service one file's processing may take. A
    tier with no row gets the DOCUMENTS_* settings' defaults; an empty field means no limit, except
    the time and memory bounds, which every file has."""

    tier = models.OneToOneField("accounts.Tier", on_delete=models.CASCADE, related_name="document_limits")
    max_file_bytes = models.PositiveBigIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_files = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_total_bytes = models.PositiveBigIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_unpacked_bytes = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="What an archive format (DOCX) may unpack to, all its parts together.",
    )
    max_pages = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Pages of a PDF."
    )
    max_paragraphs = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Paragraphs of one file, empty ones too."
    )
    max_chunks = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Passages one file is cut into."
    )
    processing_seconds = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(1)], help_text="Wall-clock time one file's processing may take."
    )
    processing_memory_mb = models.PositiveIntegerField(
        default=512,
        validators=[MinValueValidator(16)],
        help_text="Memory reading one file may take, beyond its own bytes (MiB).",
    )

    class Meta:
        verbose_name_plural = "tier document limits"

    def __str__(self) -> str:
        return f"Document limits of {self.tier}"
