from __future__ import annotations

import uuid
from pathlib import Path
from typing import TypeAlias

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inference.engine.base import marked_name
from inference.engine.tokenizers import chat_template_text
from inference.engine.vllm_server_internals import tool_parser_names

DTYPE_CHOICES = [
    ("auto", "auto"),
    ("bfloat16", "bfloat16"),
    ("float16", "float16"),
    ("float32", "float32"),
]


class ModelDeployment(models.Model):
    """A model the service can serve: where its weights are, how big its window is, how it runs."""

    class Engine(models.TextChoices):
        VLLM = "vllm", "vLLM"
        # Deterministic text at a set pace, no model (inference/engine/scripted.py): for tests, load
        # tests and demos, never for users' answers. Its answers say so in their model name.
        SCRIPTED = "scripted", "Scripted (no model: tests, load tests, demos)"

    class Task(models.TextChoices):
        GENERATE = "generate", "Text generation (vLLM)"
        # Served in the web process by the sentence-embedding backend (inference/openai_embeddings.py).
        EMBED = "embed", "Embeddings"

    name = models.SlugField(
        max_length=64, unique=True, help_text="The deployment's own name: its queue, its engine, its usage rows."
    )
    public_name = models.SlugField(
        max_length=64,
        blank=True,
        db_index=True,
        help_text="The model name clients ask for (/v1/models, the chat page's picker), shared by the deployments "
        "that split its traffic by weight. Empty: its own name. 'auto' is reserved.",
    )
    model = models.CharField(
        max_length=500,
        help_text="A folder under INFERENCE_MODELS_DIR, an absolute folder path, or a hub id.",
    )
    display_name = models.CharField(max_length=100, blank=True)
    task = models.CharField(
        max_length=16,
        choices=Task.choices,
        default=Task.GENERATE,
        help_text="What it serves: chat and text completions, or /v1/embeddings.",
    )
    engine = models.CharField(
        max_length=16,
        choices=Engine.choices,
        default=Engine.VLLM,
        help_text="What writes its answers: vLLM on the model, or the scripted engine (no model; only its "
        "tokenizer), whose answers carry ':scripted' in their model name. INFERENCE_ENGINE overrides it.",
    )
    max_context = models.PositiveIntegerField(default=2048, validators=[MinValueValidator(128)])
    tensor_parallel_size = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    dtype = models.CharField(
        max_length=16,
        choices=DTYPE_CHOICES,
        default="auto",
        help_text="What the engine computes in. auto: on a CPU, bfloat16 where it has it natively, else float32.",
    )
    default_max_tokens = models.PositiveIntegerField(default=512, validators=[MinValueValidator(1)])
    temperature = models.FloatField(default=0.7, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)])
    top_p = models.FloatField(default=0.9, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)])
    repetition_penalty = models.FloatField(default=1.2, validators=[MinValueValidator(0.5), MaxValueValidator(2.0)])
    system_prompt = models.TextField(blank=True, default="You are a helpful assistant.")
    engine_args = models.JSONField(default=dict, blank=True, help_text="Extra vLLM engine arguments.")
    tool_parser = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="vLLM's tool call parser for the model's output (its --tool-call-parser, e.g. hermes). "
        "Blank: the model cannot call tools, and requests with tools are refused.",
    )
    chat_template = models.TextField(
        blank=True,
        default="",
        help_text="The chat template in place of the model's own (vLLM's --chat-template): a file name in "
        "inference/chat_templates/, or the Jinja text. Blank: the model's own.",
    )
    is_enabled = models.BooleanField(default=True)
    weight = models.PositiveSmallIntegerField(
        default=100,
        help_text="Its share of its public name's new requests, against the other deployments serving that name "
        "(blue-green, canary). 0 drains it: no new requests or conversations; running answers finish.",
    )
    max_queued = models.PositiveIntegerField(
        default=64,
        validators=[MinValueValidator(1)],
        help_text="Admission control: new requests are refused while this many generations wait in the queue.",
    )
    utility_deployment = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The model that writes this one's summaries of long conversations (orchestration.memory). "
        "Empty: this model itself.",
    )
    semantic_cache = models.BooleanField(
        default=False,
        help_text="Answer first messages without personal context from the semantic response cache "
        "(orchestration.cache) when a close enough one was answered before.",
    )
    accepts_images = models.BooleanField(
        default=False,
        help_text="A vision model: images in a message go to the engine as images (vLLM's multimodal input). "
        "Otherwise the model gets the text OCR read in them, and is told so.",
    )
    image_tokens = models.PositiveIntegerField(
        default=576,
        validators=[MinValueValidator(1)],
        help_text="About how many prompt tokens one image takes in this model, held against the window "
        "and the plan's limits before the engine reports the exact count (which is what is charged).",
    )
    # Declared here, pointing down at accounts' tiers; the table is the one accounts made when it held
    # the list (`tier.deployments` reads it from the tier's side).
    tiers = models.ManyToManyField(
        "accounts.Tier",
        blank=True,
        related_name="deployments",
        db_table="accounts_tier_deployments",
        help_text="The tiers that may use it (besides those with every deployment).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """A parser vLLM knows and a template that is there: else every request with tools would fail."""
        errors = {}
        if self.tool_parser and self.tool_parser not in tool_parser_names():
            errors["tool_parser"] = f"vLLM has no tool parser named {self.tool_parser!r}."
        try:
            chat_template_text(self.chat_template)
        except ValueError as exc:
            errors["chat_template"] = str(exc)
        if errors:
            raise ValidationError(errors)

    @property
    def label(self) -> str:
        return self.display_name or self.name

    @property
    def engine_kind(self) -> str:
        """The engine that runs it: the process's INFERENCE_ENGINE where set, else its own `engine`."""
        return settings.INFERENCE_ENGINE or self.engine

    @property
    def answer_model(self) -> str:
        """The model name its answers carry: its name, marked where no model writes them (`marked_name`)."""
        return marked_name(self.name, self.engine_kind)

    @property
    def public_model(self) -> str:
        """The model name clients ask for and see in lists; several deployments may share one."""
        return self.public_name or self.name

    @property
    def model_path(self) -> str:
        """The folder vLLM and the tokenizer load, or the hub id when no such folder exists."""
        candidate = Path(self.model)
        if not candidate.is_absolute():
            candidate = Path(settings.INFERENCE_MODELS_DIR) / self.model
        return str(candidate) if candidate.exists() else self.model

    @property
    def queue_name(self) -> str:
        return f"gpu.{self.name}"


# A generation's id as it travels: the row's UUID, or its text (in a task, a channel message, a runner's keys).
GenerationId: TypeAlias = uuid.UUID | str


class Generation(models.Model):
    """One request to the engine: the unit that is queued, streamed, stopped and charged."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETE = "complete"
        STOPPED = "stopped"
        FAILED = "failed"

    class Purpose(models.TextChoices):
        ANSWER = "answer"
        # A conversation's title, which the service asks for itself: not charged to the user.
        TITLE = "title"
        # The running summary of a long conversation's oldest turns (orchestration.memory): the
        # service's own request, paid for by the house (docs/conversations.md).
        SUMMARY = "summary"

    FINISHED = (Status.COMPLETE, Status.STOPPED, Status.FAILED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="generations")
    deployment = models.ForeignKey(ModelDeployment, on_delete=models.PROTECT, related_name="generations")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    prompt_token_ids = models.JSONField(help_text="The assembled prompt, tokenized with the model's tokenizer.")
    sampling = models.JSONField(default=dict, help_text="vLLM SamplingParams fields for this request.")
    priority = models.SmallIntegerField(default=0, help_text="Lower is served first (vLLM's convention).")
    queue_priority = models.SmallIntegerField(
        null=True, blank=True, help_text="The broker priority its task was last sent with (aging lowers it)."
    )
    text = models.TextField(blank=True, default="")
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.CharField(max_length=500, blank=True, default="")
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(
        default=0, help_text="Of the prompt's tokens, those the engine found in its prefix cache."
    )
    completion_tokens = models.PositiveIntegerField(default=0)
    routing_reason = models.CharField(
        max_length=300, blank=True, default="", help_text="Why the router chose its deployment (orchestration.routing)."
    )
    stop_requested = models.BooleanField(default=False)
    awaiting_verdict = models.BooleanField(
        default=False,
        help_text="Input moderation's verdict on its message is still coming: the answer is computed, not shown.",
    )
    worker = models.CharField(max_length=200, blank=True, default="")
    purpose = models.CharField(max_length=16, choices=Purpose.choices, default=Purpose.ANSWER)
    cached = models.BooleanField(
        default=False,
        help_text="Answered from the semantic response cache: `text` is an earlier answer, played back; no engine ran.",
    )
    image_count = models.PositiveSmallIntegerField(
        default=0, help_text="Images that go to the engine with the prompt (GenerationImage), in order."
    )
    tool_fields = models.JSONField(
        default=dict,
        blank=True,
        help_text="A step of an answer's tool loop: the tool fields of its request (tools, tool_choice), "
        "which its output is read with for calls by every socket that follows it. Empty otherwise.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def group_name(self) -> str:
        return f"generation.{self.id}"


class GenerationImage(models.Model):
    """An image a generation's prompt shows a vision model, as the service cleaned it (decoded within
    its sender's plan and encoded again: no metadata); the worker that runs the generation reads it
    from here, so the image needs nothing but the database to reach a worker on another host."""

    generation = models.ForeignKey(Generation, on_delete=models.CASCADE, related_name="images")
    ordinal = models.PositiveSmallIntegerField()
    content_type = models.CharField(max_length=32)
    data = models.BinaryField()

    class Meta:
        ordering = ["generation_id", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["generation", "ordinal"], name="generation_image_ordinal_unique")
        ]

    def __str__(self) -> str:
        return f"image {self.ordinal} of generation {self.generation_id}"


class ProcessHeartbeat(models.Model):
    """A process that runs generations in its own event loop (the embedded default's server), and
    when it last said it was alive. Another process ends that one's running generations only once it
    has gone silent: two servers on one database must not fail each other's answers. The row lives in
    the database because that is all such processes share (there may be no Redis), and its time is
    the database's, so processes on different hosts need no agreement between their clocks."""

    name = models.CharField(max_length=200, primary_key=True, help_text="The `worker` of the generations it claims.")
    seen_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return self.name
