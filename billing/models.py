"""The ledger: what each tier pays per model (prices), and what each user used and was charged
(usage records). Above inference, whose deployments and generations its rows point at."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone


class TierModelPrice(models.Model):
    """What a tier pays per 1,000 tokens on one deployment. No row means that deployment is free for the tier."""

    tier = models.ForeignKey("accounts.Tier", on_delete=models.CASCADE, related_name="prices")
    deployment = models.ForeignKey("inference.ModelDeployment", on_delete=models.CASCADE, related_name="prices")
    prompt_price_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(Decimal("0"))]
    )
    completion_price_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(Decimal("0"))]
    )
    cached_prompt_price_per_1k = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Per 1,000 prompt tokens the engine found in its prefix cache. Empty: the prompt price.",
    )

    class Meta:
        db_table = "accounts_tiermodelprice"  # made by accounts, which held the ledger first
        constraints = [models.UniqueConstraint(fields=["tier", "deployment"], name="one_price_per_tier_and_deployment")]

    def __str__(self) -> str:
        return f"{self.tier} on {self.deployment}"


class UsageRecord(models.Model):
    """The ledger: one row per finished generation (a summary's or a cached answer's free: `Kind`), priced with the tier's prices at that moment,
    one per /v1/moderations request (its input's tokens, which count towards the quotas), and one
    per /v1/embeddings request (its input's tokens at the tier's prompt price for the deployment).

    The one-to-one on the generation is what makes charging a generation idempotent: a retried task
    or a second signal cannot add a second row.
    """

    class Kind(models.TextChoices):
        GENERATION = "generation", "Generation"
        MODERATION = "moderation", "Moderation"
        EMBEDDING = "embedding", "Embedding"
        # The service's own work for a conversation, and answers the response cache played back:
        # recorded with their tokens, free of charge, and not counted towards the quotas.
        SUMMARY = "summary", "Conversation summary"
        CACHED = "cached", "Cached answer"
        # A tool the service ran in an answer's tool loop, at the tool's own cost (a search provider's
        # fee); its model calls are generations, charged as such.
        TOOL = "tool", "Tool call"

    # SET_NULL: a deleted account's records stay on the ledger without it, numbered by `former_account`.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="usage_records"
    )
    former_account = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The id of the deleted account these tokens were charged to."
    )
    # SET_NULL: clearing old generations away must not erase what was billed for them.
    generation = models.OneToOneField(
        "inference.Generation", null=True, on_delete=models.SET_NULL, related_name="usage_record"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.GENERATION)
    deployment = models.ForeignKey(
        "inference.ModelDeployment",
        null=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
        help_text="Empty for a moderation request: no model ran.",
    )
    tier = models.ForeignKey(
        "accounts.Tier",
        null=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
        help_text="Empty: no tier existed.",
    )
    status = models.CharField(max_length=16)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(
        default=0, help_text="Of the prompt tokens, those served from the engine's prefix cache (cached price)."
    )
    completion_tokens = models.PositiveIntegerField(default=0)
    prompt_price_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    cached_price_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    completion_price_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    cost = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal("0"))
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "accounts_usagerecord"  # made by accounts, which held the ledger first
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["user", "created_at"])]

    def __str__(self) -> str:
        return f"{self.user_id} {self.deployment_id or self.kind} {self.total_tokens} tokens {self.cost}"

    @property
    def model_name(self) -> str:
        """What the row was for, as the usage pages name it (a moderation request has no model)."""
        return self.deployment.name if self.deployment is not None else self.kind

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
