from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from moderation.classifiers import CATEGORIES, PROMPT_INJECTION

CATEGORY_CHOICES = [(c, c) for c in (*CATEGORIES, PROMPT_INJECTION)]


class Action(models.TextChoices):
    ALLOW = "allow"
    WARN = "warn"
    BLOCK = "block"
    BLOCK_AND_REVIEW = "block_and_review", "Block and review"


# Most severe last: when several categories trip, the most severe action wins.
ACTION_SEVERITY = {Action.ALLOW: 0, Action.WARN: 1, Action.BLOCK: 2, Action.BLOCK_AND_REVIEW: 3}


class ModerationPolicy(models.Model):
    """Thresholds and actions per category, for everyone or for one tier.

    A policy without a tier is the global policy, used by anyone whose tier has no active policy of
    its own. At most one policy is active per tier, and one global.
    """

    name = models.CharField(max_length=100, unique=True)
    tier = models.ForeignKey(
        "accounts.Tier",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="moderation_policies",
        help_text="The tier this policy is for; empty for the global policy.",
    )
    is_active = models.BooleanField(default=True)
    moderate_input = models.BooleanField(default=True, help_text="Check messages before they reach the model.")
    moderate_output = models.BooleanField(default=True, help_text="Check answers while they stream.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "moderation policies"
        ordering = ["tier__name", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["tier"],
                condition=models.Q(is_active=True, tier__isnull=False),
                name="one_active_policy_per_tier",
            ),
            models.UniqueConstraint(
                fields=["is_active"],
                condition=models.Q(is_active=True, tier__isnull=True),
                name="one_active_global_policy",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class PolicyRule(models.Model):
    """One category's threshold and what happens when a score reaches it."""

    policy = models.ForeignKey(ModerationPolicy, on_delete=models.CASCADE, related_name="rules")
    category = models.CharField(max_length=32, choices=CATEGORY_CHOICES)
    threshold = models.FloatField(validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    action = models.CharField(max_length=16, choices=Action.choices)

    class Meta:
        ordering = ["category"]
        constraints = [models.UniqueConstraint(fields=["policy", "category"], name="one_rule_per_category")]

    def __str__(self) -> str:
        return f"{self.category} ≥ {self.threshold}: {self.action}"


class Flag(models.Model):
    """A message the classifiers flagged, and what a moderator decided about it."""

    class Source(models.TextChoices):
        INPUT = "input"
        OUTPUT = "output"

    class ReviewState(models.TextChoices):
        OPEN = "open", "Waiting for review"
        DISMISSED = "dismissed", "Dismissed (false positive)"
        CONFIRMED = "confirmed"
        NOT_REQUIRED = "not_required", "No review requested"

    class UserAction(models.TextChoices):
        NONE = "", "None"
        WARNED = "warned"
        SUSPENDED = "suspended"

    # The message it is about is kept beside the messages (conversations.FlaggedMessage), pointing down
    # here: `flag.message_link`, from a layer this one never imports (moderation.subjects).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="moderation_flags")
    source = models.CharField(max_length=8, choices=Source.choices)
    text = models.TextField(help_text="What was classified: for an answer, everything the model wrote.")
    categories = models.JSONField(default=list, help_text="The categories that reached their threshold.")
    category_scores = models.JSONField(default=dict)
    action = models.CharField(max_length=16, choices=Action.choices)
    policy = models.ForeignKey(ModerationPolicy, null=True, blank=True, on_delete=models.SET_NULL)
    review_state = models.CharField(max_length=16, choices=ReviewState.choices, default=ReviewState.OPEN)
    user_action = models.CharField(max_length=16, choices=UserAction.choices, blank=True, default="")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["review_state", "-created_at"])]
        permissions = [("review_flag", "Can see flagged messages and decide on them")]

    def __str__(self) -> str:
        return f"{self.source} flag {self.pk} ({', '.join(self.categories) or 'none'})"

    @property
    def is_reviewed(self) -> bool:
        return self.review_state in (self.ReviewState.DISMISSED, self.ReviewState.CONFIRMED)
