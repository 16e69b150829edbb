from __future__ import annotations

from django.conf import settings
from django.db import models


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


class ToolGrant(models.Model):
    """A tool the service runs itself that a deployment's model may call, for one plan or for all
    (`tier` empty). A tool is offered to an answer when a grant names its deployment and the person's
    plan, the tool is registered (orchestration.tools.registry) and its configuration is present."""

    deployment = models.ForeignKey("inference.ModelDeployment", on_delete=models.CASCADE, related_name="tool_grants")
    tier = models.ForeignKey(
        "accounts.Tier",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tool_grants",
        help_text="Empty: every plan.",
    )
    tool = models.CharField(
        max_length=64, help_text="The tool's name, as the registry knows it (search_files, web_search…)."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "tier", "tool"], name="tool_grant_unique"),
            models.UniqueConstraint(
                fields=["deployment", "tool"], condition=models.Q(tier=None), name="tool_grant_unique_all_tiers"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} on {self.deployment_id} ({self.tier_id or 'every plan'})"
