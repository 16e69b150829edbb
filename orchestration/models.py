from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
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


MCP_SERVER_NAME = RegexValidator(
    r"^[A-Za-z0-9]{1,20}$", "Letters and digits only, at most 20: it prefixes the names of the server's tools."
)
ENV_VAR_NAME = RegexValidator(
    r"^[A-Z_][A-Z0-9_]{0,127}$", "The name of an environment variable, like MCP_SEARCH_TOKEN."
)
HTTP_HEADER_NAME = RegexValidator(r"^[A-Za-z0-9-]{1,64}$", "A header name, like Authorization.")


class McpServer(models.Model):
    """A Model Context Protocol server an operator adds, whose tools the chosen tiers' chats may use
    (orchestration.tools.mcp). Streamable HTTP reaches a URL; stdio starts a command on this machine,
    which only a superuser may set, since it runs with the service's own rights."""

    class Transport(models.TextChoices):
        HTTP = "http", "Streamable HTTP"
        STDIO = "stdio", "stdio (a command on this machine)"

    name = models.CharField(max_length=20, unique=True, validators=[MCP_SERVER_NAME])
    transport = models.CharField(max_length=8, choices=Transport.choices, default=Transport.HTTP)
    url = models.URLField(
        max_length=500,
        blank=True,
        help_text="Streamable HTTP: the server's endpoint, like https://mcp.example.com/mcp.",
    )
    auth_header = models.CharField(
        max_length=64, blank=True, default="Authorization", validators=[HTTP_HEADER_NAME], help_text="Streamable HTTP."
    )
    auth_env_var = models.CharField(
        max_length=128,
        blank=True,
        validators=[ENV_VAR_NAME],
        help_text='Streamable HTTP: the environment variable holding the header\'s value ("Bearer …"); '
        "the value itself is never stored here.",
    )
    command = models.CharField(max_length=500, blank=True, help_text="stdio: the program to start.")
    args = models.JSONField(default=list, blank=True, help_text="stdio: its arguments, a JSON list of strings.")
    enabled = models.BooleanField(default=True)
    tiers = models.ManyToManyField(
        "accounts.Tier",
        blank=True,
        related_name="+",
        help_text="The tiers whose chats may use its tools (none: nobody).",
    )
    timeout_s = models.FloatField(
        default=30.0,
        validators=[MinValueValidator(1.0), MaxValueValidator(600.0)],
        help_text="How long one call may take, connecting included.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.transport == self.Transport.HTTP:
            if not self.url:
                raise ValidationError({"url": "A Streamable HTTP server needs its URL."})
            if self.url.split(":", 1)[0].lower() not in {"http", "https"}:
                raise ValidationError({"url": "An http or https URL."})
            if self.command or self.args:
                raise ValidationError({"command": "A command is for a stdio server."})
        else:
            if not self.command:
                raise ValidationError({"command": "A stdio server needs its command."})
            if self.url:
                raise ValidationError({"url": "A URL is for a Streamable HTTP server."})
        if not isinstance(self.args, list) or not all(isinstance(arg, str) for arg in self.args):
            raise ValidationError({"args": 'A JSON list of strings, like ["-m", "my_server"].'})
