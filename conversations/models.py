from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    # Empty until the model has written one after the first answer (or its owner names it): the
    # page shows "New chat" meanwhile, and a message moderation held back never becomes a title.
    title = models.CharField(max_length=200, blank=True, default="")
    pinned = models.BooleanField(default=False, help_text="Shown above the others in its owner's list.")
    title_generation = models.OneToOneField(
        "inference.Generation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="titled_conversation",
        help_text="The short generation asked to write the title, once one was asked for.",
    )
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


class SharedConversation(models.Model):
    """A read-only snapshot of a conversation, readable by anyone holding its link's token.

    The messages are copied when it is shared, so what the link shows does not change as the
    conversation goes on, and nothing of the owner's account goes with it. One per conversation:
    revoking deletes it (the link then 404s), and so does deleting the conversation."""

    conversation = models.OneToOneField(Conversation, on_delete=models.CASCADE, related_name="share")
    token = models.CharField(max_length=64, unique=True, editable=False)
    title = models.CharField(max_length=200)
    messages = models.JSONField(default=list, help_text="[{role, content}] as they were when shared.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Share of {self.conversation_id}"
