from __future__ import annotations

import re

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from chatsite.env import sso_url_problem


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
    # `deployments`: the deployments this tier may use, declared on inference.ModelDeployment (`tiers`),
    # the layer above, which points down at the tiers.
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
    conversation_prompt_chars = models.PositiveIntegerField(
        default=2000,
        help_text="The longest system prompt a conversation's settings may give (characters).",
    )
    # Every plan has an image bound: it protects the service (decoding), not only the plan's storage.
    max_image_bytes = models.PositiveIntegerField(
        default=10 * 1024 * 1024,
        validators=[MinValueValidator(1024)],
        help_text="The largest image a message or file may carry, as sent (bytes).",
    )
    max_image_pixels = models.PositiveIntegerField(
        default=25_000_000,
        validators=[MinValueValidator(10_000)],
        help_text="The most pixels (width × height) an image may decode to; more is refused unread.",
    )
    other_requests_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Every page and API request without a limit of its own: reads, renames, deletes, exports, feedback.",
    )

    # The sampling temperature a conversation's settings may set, on every plan: vLLM's own range is
    # wider, but past 2 a model's answers are noise.
    TEMPERATURE_MIN = 0.0
    TEMPERATURE_MAX = 2.0

    class Meta:
        ordering = ["priority", "name"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_tier")
        ]

    def __str__(self) -> str:
        return self.display_name or self.name


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

    verified_email = models.EmailField(
        blank=True, help_text="The address a verification link was opened for: verified while it is the email."
    )

    @property
    def email_verified(self) -> bool:
        return bool(self.email) and self.verified_email.lower() == self.email.lower()

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


class SignedInSession(models.Model):
    """A session a user signed in with, for their list of where they are signed in. The session
    itself is Django's (its row holds the sign-in); this row says what it was opened from. A row
    whose session has ended or expired is not listed and is cleared when the list is read."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="signed_in_sessions")
    session_key = models.CharField(max_length=40, unique=True)
    user_agent = models.CharField(max_length=300, blank=True, default="")
    address = models.CharField(max_length=45, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.user_id} {self.created_at:%Y-%m-%d %H:%M}"


class TotpDevice(models.Model):
    """A person's authenticator app: the secret it shares with the service (RFC 6238 TOTP). Its
    codes are the second factor at sign-in (docs/accounts.md); each works once (`last_step`)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="totp_device")
    secret = models.CharField(max_length=64, help_text="Base32, as the authenticator app was given it.")
    last_step = models.BigIntegerField(default=0, help_text="The time step of the last code accepted.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"authenticator of {self.user_id}"


class RecoveryCode(models.Model):
    """A one-time code for signing in without the authenticator; only a hash of it is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="recovery_codes")
    code_hash = models.CharField(max_length=64)
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"recovery code of {self.user_id}"


class IdentityProvider(models.Model):
    """An identity provider people may sign in through, added in the admin (those named in the
    environment, SSO_PROVIDERS, need no row). Its client secret stays in the environment: the row
    names the variable that holds it."""

    class Preset(models.TextChoices):
        OIDC = "oidc", "OpenID Connect (any provider, by its issuer URL)"
        GOOGLE = "google", "Google"
        GITHUB = "github", "GitHub (OAuth 2.0)"
        MICROSOFT = "microsoft", "Microsoft Entra ID"

    slug = models.SlugField(max_length=32, unique=True, help_text="In the sign-in URL: /accounts/sso/<slug>/.")
    label = models.CharField(max_length=64, blank=True, help_text="On the button: “Sign in with <label>”.")
    preset = models.CharField(max_length=16, choices=Preset.choices, default=Preset.OIDC)
    issuer = models.URLField(
        blank=True, help_text="OpenID Connect: the issuer URL. GitHub Enterprise Server: its address."
    )
    tenant = models.CharField(max_length=64, blank=True, help_text="Microsoft Entra ID: the tenant's id.")
    client_id = models.CharField(max_length=255)
    client_secret_env = models.CharField(
        max_length=64,
        help_text="The name of the environment variable that holds the client secret (secrets stay out of the database).",
    )
    scopes = models.CharField(max_length=255, blank=True, help_text="Empty: the preset's.")
    tier_claim = models.CharField(
        max_length=64, blank=True, help_text="A claim holding groups or roles (e.g. groups, roles); empty: no mapping."
    )
    tier_map = models.JSONField(
        default=list,
        blank=True,
        help_text='[["group or role", "tier name"], …] in order: the first a person has sets their tier at each sign-in.',
    )
    create_accounts = models.BooleanField(default=True, help_text="Create an account for a new verified address.")
    enabled = models.BooleanField(default=True)

    def __str__(self) -> str:
        return self.label or self.slug

    def clean(self) -> None:
        errors = {}
        if self.issuer and (problem := sso_url_problem(self.issuer)):
            errors["issuer"] = problem
        if self.preset == self.Preset.OIDC and not self.issuer:
            errors["issuer"] = "OpenID Connect needs the provider's issuer URL."
        if self.preset == self.Preset.MICROSOFT and not self.tenant and not self.issuer:
            errors["tenant"] = "Microsoft Entra ID needs the tenant's id."
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", self.client_secret_env or ""):
            errors["client_secret_env"] = "The name of an environment variable, e.g. SSO_CORP_CLIENT_SECRET."
        if not isinstance(self.tier_map, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, str) and v for v in pair)
            for pair in self.tier_map
        ):
            errors["tier_map"] = 'A list of ["group", "tier"] pairs.'
        elif unknown := {tier for _, tier in self.tier_map} - set(Tier.objects.values_list("name", flat=True)):
            errors["tier_map"] = f"No such tier: {', '.join(sorted(unknown))}."
        if errors:
            raise ValidationError(errors)


class ExternalIdentity(models.Model):
    """A provider's account (its `sub`, or GitHub's user id) linked to a user: found again by it at
    each sign-in, whatever address the provider then gives."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identities")
    provider = models.CharField(max_length=32)
    subject = models.CharField(max_length=255)
    email = models.EmailField(blank=True, help_text="The verified address it was linked by, or last gave.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "subject"], name="external_identity_unique")]

    def __str__(self) -> str:
        return f"{self.provider}:{self.subject} of {self.user_id}"


class Passkey(models.Model):
    """A WebAuthn credential (a passkey) a person registered: its public key, and the count of
    signatures its authenticator reported last (a clone's count falls behind)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="passkeys")
    name = models.CharField(max_length=64)
    credential_id = models.CharField(max_length=1400, unique=True, help_text="base64url, as the browser names it.")
    public_key = models.BinaryField()
    sign_count = models.PositiveBigIntegerField(default=0)
    transports = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"passkey “{self.name}” of {self.user_id}"
