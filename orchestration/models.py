from __future__ import annotations

from django.conf import settings
from django.db import models


class ConversationSummary(models.Model):
    """The running summary of a conversation's oldest turns (orchestration.memory), as of one message.

    Each summary extends the one before it (`previous`) with the turns that fell out of the window
    since: it covers the branch from the conversation's first message to `through`, and serves any
    prompt whose branch passes through that message (an edit further up starts a branch it does not
    cover). Written by a generation of its own (`purpose` "summary") in the background; until it has
    ended well (`ready`), prompts go on from the previous one, or from the sliding window."""

    class Status(models.TextChoices):
        PENDING = "pending"
        READY = "ready"
        FAILED = "failed"

    # Lazy references to the layer above, which this layer never imports: a summary goes with its
    # conversation and with the message it runs to.
    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="summaries", db_index=True
    )
    through = models.ForeignKey(
        "conversations.Message",
        on_delete=models.CASCADE,
        related_name="+",
        help_text="The last message the summary covers: it covers the branch from the first one to this.",
    )
    previous = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    turns_covered = models.PositiveIntegerField(default=0, help_text="Messages of the branch it covers.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    text = models.TextField(blank=True, default="")
    generation = models.OneToOneField(
        "inference.Generation", null=True, blank=True, on_delete=models.SET_NULL, related_name="summary"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-turns_covered", "-id"]
        constraints = [
            # One summary is written at a time per conversation: the claim that starts one.
            models.UniqueConstraint(
                fields=["conversation"], condition=models.Q(status="pending"), name="summary_one_pending"
            )
        ]

    def __str__(self) -> str:
        return f"Summary of conversation {self.conversation_id} through {self.through_id} ({self.status})"


class CachedResponse(models.Model):
    """An answer the semantic response cache (orchestration.cache) may play back to a close enough
    prompt with the same `key` (deployment, its configuration, system prompt and sampling).

    Written with the prompt's embedding when its request misses, and taken up the first time it
    would be served, once its generation has ended on its own ("stop"): its answer is copied in and
    judged by moderation (`judged`), and one that does not pass is deleted, never served."""

    deployment = models.ForeignKey("inference.ModelDeployment", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64, db_index=True)
    prompt = models.TextField()
    embedding = models.BinaryField(help_text="The prompt's unit-length sentence embedding, float32.")
    text = models.TextField(blank=True, default="")
    completion_tokens = models.PositiveIntegerField(default=0)
    judged = models.BooleanField(default=False, help_text="Moderation passed its prompt and its answer (`text`).")
    generation = models.OneToOneField(
        "inference.Generation", null=True, on_delete=models.SET_NULL, related_name="cache_entry"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    hits = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["key", "created_at"])]

    def __str__(self) -> str:
        return f"{self.prompt[:40]} ({self.hits} hits)"
