from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Tier(models.Model):
    """What a plan unlocks: models, rate limits, token quotas, window and output size, queue priority.

    Rows, not constants: an admin edits them. An empty limit means "no limit".
    """

    name = models.SlugField(max_length=32, unique=True)
    display_name = models.CharField(max_length=64, blank=True)
    is_default = models.BooleanField(default=False, help_text="New users get this tier (exactly one tier has it).")
    all_deployments = models.BooleanField(
        default=False, help_text="May use every enabled deployment, including ones added later."
    )
    deployments = models.ManyToManyField(
        "inference.ModelDeployment", blank=True, related_name="tiers", help_text="Deployments this tier may use."
    )
    # Not a field: a column of the query in accounts.selectors.tier_for_user_on_deployment, on the rows it reads.
    includes_deployment: bool
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Prompt plus requested output tokens, charged when a request is admitted.",
    )
    tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    tokens_per_month = models.PositiveBigIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_context = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(128)],
        help_text="Caps the model's window (prompt + answer).",
    )
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    priority = models.SmallIntegerField(
        default=0, help_text="Queue priority: lower is served first (vLLM's convention)."
    )
    # The lighter endpoints' own limits, per user: each is cheap once, not a thousand times a minute.
    moderations_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="/v1/moderations requests; their input also counts towards the token limits and quotas.",
    )
    model_lists_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="/v1/models requests."
    )
    conversations_per_hour = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Empty conversations created through the API (a first message's own is a request).",
    )
    api_keys_per_day = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="API keys created."
    )
    file_uploads_per_hour = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Files uploaded (the files API, the files page, a conversation's files), refused ones included.",
    )
    documents_per_day = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Files whose processing starts (extracting, moderating, embedding): every upload starts one.",
    )
    file_searches_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="/api/files/search/ requests."
    )
    other_requests_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Every page and API request without a limit of its own: reads, renames, deletes, exports, feedback.",
    )

    class Meta:
        ordering = ["priority", "name"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_tier")
        ]

    def __str__(self) -> str:
        return self.display_name or self.name


class TierModelPrice(models.Model):
    """What a tier pays per 1,000 tokens on one deployment. No row means that deployment is free for the tier."""

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="prices")
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
        constraints = [models.UniqueConstraint(fields=["tier", "deployment"], name="one_price_per_tier_and_deployment")]

    def __str__(self) -> str:
        return f"{self.tier} on {self.deployment}"


class User(AbstractUser):
    """The service's user. Custom from the first migration so tiers and billing can hang off it."""

    tier = models.ForeignKey(
        Tier,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="users",
        help_text="Empty means the default tier.",
    )

    class Meta(AbstractUser.Meta):
        swappable = "AUTH_USER_MODEL"
        permissions = [("review_moderation", "Can review moderation flags")]


class ApiKey(models.Model):
    """A key for the API: `cs_<prefix>_<secret>`. Only a hash of the secret is stored."""

    class Scope(models.TextChoices):
        CHAT = "chat", "Chat completions"
        CONVERSATIONS_READ = "conversations:read", "Read conversations"
        CONVERSATIONS_WRITE = "conversations:write", "Write conversations"
        MODELS_READ = "models:read", "List models"
        EMBEDDINGS = "embeddings", "Embeddings"

    # What the page ticks for a new key: enough for an OpenAI client to list the models, chat
    # (text completions and tokenizing included) and embed. Keys made before embeddings existed
    # keep the scopes they were given.
    DEFAULT_SCOPES = (Scope.CHAT, Scope.MODELS_READ, Scope.EMBEDDINGS)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, help_text="Shown to the user to tell keys apart.")
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # A key's own caps, under its user's plan (which all the user's keys and the browser share).
    requests_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Optional: at most this many requests a minute with this key, within the plan's.",
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Optional: at most this many tokens a minute with this key, within the plan's.",
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} (cs_{self.prefix}_…)"

    @property
    def display_key(self) -> str:
        return f"cs_{self.prefix}_…"

    def is_active_at(self, when) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > when)

    @property
    def is_active(self) -> bool:
        return self.is_active_at(timezone.now())

    def has_scope(self, scope: str) -> bool:
        return scope in (self.scopes or [])


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

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_records")
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
        Tier, null=True, on_delete=models.PROTECT, related_name="usage_records", help_text="Empty: no tier existed."
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


class UserSettings(models.Model):
    """A person's own preferences for the chat page: what the model should know about them and how
    it should answer (both go into the system prompt, `conversations.prompts`), the model new chats
    start on, and the page's colour theme. No row means every default."""

    class Theme(models.TextChoices):
        SYSTEM = "system", "Follow the system"
        LIGHT = "light", "Light"
        DARK = "dark", "Dark"

    ABOUT_MAX_CHARS = 1500
    STYLE_MAX_CHARS = 1500

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_settings")
    about_me = models.TextField(
        max_length=ABOUT_MAX_CHARS, blank=True, help_text="What the model should know about you."
    )
    answer_style = models.TextField(max_length=STYLE_MAX_CHARS, blank=True, help_text="How the model should answer.")
    # The deployment's name, not a key: a model that is renamed, disabled or leaves the plan falls
    # back to the service's default rather than taking the person's settings with it.
    default_model = models.CharField(max_length=100, blank=True)
    theme = models.CharField(max_length=8, choices=Theme.choices, default=Theme.SYSTEM)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "user settings"
        verbose_name_plural = "user settings"

    def __str__(self) -> str:
        return f"settings of {self.user_id}"

    @property
    def instructions(self) -> str:
        """The custom instructions as the system prompt carries them: marked as the person's own
        words, so the model takes them as preferences, not as the service's rules."""
        parts = []
        if self.about_me.strip():
            parts.append(f"The user says this about themselves:\n{self.about_me.strip()}")
        if self.answer_style.strip():
            parts.append(f"The user asks you to answer like this:\n{self.answer_style.strip()}")
        return "\n\n".join(parts)
