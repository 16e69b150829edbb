from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True, default="")
    deployment = models.ForeignKey("inference.ModelDeployment", on_delete=models.PROTECT, related_name="conversations")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["user", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @property
    def display_title(self) -> str:
        return self.title or "New chat"


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        PENDING = "pending"
        STREAMING = "streaming"
        COMPLETE = "complete"
        STOPPED = "stopped"
        FAILED = "failed"
        # Held back by moderation: a message never sent to the model, or an answer cut off.
        FLAGGED = "flagged"

    IN_PROGRESS = (Status.PENDING, Status.STREAMING)

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    token_count = models.PositiveIntegerField(default=0, help_text="Tokens of the content alone.")
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        help_text="The message this one answers or replaces (edits and regenerations).",
    )
    generation = models.OneToOneField(
        "inference.Generation", null=True, blank=True, on_delete=models.SET_NULL, related_name="message"
    )
    client_id = models.UUIDField(
        null=True,
        blank=True,
        editable=False,
        help_text="The sender's own id for a user message, so that a message sent twice is saved once.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["conversation", "created_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["client_id"], condition=models.Q(client_id__isnull=False), name="message_client_id_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"

    @property
    def is_in_progress(self) -> bool:
        return self.status in self.IN_PROGRESS
