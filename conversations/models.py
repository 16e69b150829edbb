from __future__ import annotations

from django.conf import settings
from django.db import models


class Project(models.Model):
    """A person's group of conversations with instructions, files and a default model of its own
    (docs/conversations.md, Projects). Its chats' prompts carry its instructions after the person's
    custom instructions, and their searches take in its files (`ProjectFile`)."""

    NAME_MAX_CHARS = 100
    INSTRUCTIONS_MAX_CHARS = 1500

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="projects")
    name = models.CharField(max_length=NAME_MAX_CHARS)
    instructions = models.TextField(max_length=INSTRUCTIONS_MAX_CHARS, blank=True, default="")
    # As a conversation keeps the model it was asked for (`Conversation.model_name`): a public model
    # name the picker offers ("auto" included). Empty: the person's own default.
    default_model = models.CharField(max_length=100, blank=True, default="")
    # Its files, through rows that point down at them: `Document.objects.filter(project=...)`. A
    # project deleted takes its files with it (conversations.receivers).
    documents = models.ManyToManyField(
        "documents.Document", through="ProjectFile", related_name="projects", related_query_name="project"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        indexes = [models.Index(fields=["owner", "name"])]

    def __str__(self) -> str:
        return self.name


class Conversation(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    # The project it is in, if any: always its owner's. Deleting a project is the service's
    # (`project_delete`): its chats go with it or leave it, as the person chose; the key only keeps
    # the rows consistent should a project go some other way (its owner deleted).
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations")
    # Empty until the model has written one after the first answer (or its owner names it): the
    # page shows "New chat" meanwhile, and a message moderation held back never becomes a title.
    title = models.CharField(max_length=200, blank=True, default="")
    pinned = models.BooleanField(default=False, help_text="Shown above the others in its owner's list.")
    # Out of the sidebar's list and its search while set, in the Archived view instead; it still opens,
    # and a message sent in it leaves it archived.
    archived_at = models.DateTimeField(
        null=True, blank=True, help_text="When its owner archived it; empty while it is in their list."
    )
    title_generation = models.OneToOneField(
        "inference.Generation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="titled_conversation",
        help_text="The short generation asked to write the title, once one was asked for.",
    )
    # The files attached to it, through rows that point down at them: `Document.objects.filter(
    # conversation=...)`. A conversation deleted takes its files with it (conversations.receivers).
    documents = models.ManyToManyField(
        "documents.Document",
        through="ConversationFile",
        related_name="conversations",
        related_query_name="conversation",
    )
    # The deployment its answers are routed to, kept from message to message (orchestration.routing)
    # until it is drained or gone; `model_name` is the public name it was asked for ("auto" included).
    deployment = models.ForeignKey("inference.ModelDeployment", on_delete=models.PROTECT, related_name="conversations")
    model_name = models.CharField(
        max_length=64, blank=True, default="", help_text="The model asked for. Empty: its deployment's public name."
    )
    # Its owner's settings for it (conversation_settings_update, within the plan's limits): a system
    # prompt that goes into every answer's system turn after the person's custom instructions, and the
    # sampling temperature of its answers (None: the deployment's).
    system_prompt = models.TextField(blank=True, default="")
    # Tools the service runs itself: on for this chat (the model decides when to call them), and the
    # tools with side effects the person allowed for the whole chat (docs/tools.md).
    tools_enabled = models.BooleanField(default=False)
    tools_allowed = models.JSONField(default=list, blank=True)
    temperature = models.FloatField(null=True, blank=True)
    # The leaf of the branch last shown or answered: what the page shows on a reload and what a send
    # without a `parent` continues. None (never set, or its message gone): the newest leaf.
    active_leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["user", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @property
    def model(self) -> str:
        """The model its messages are routed by, as the picker shows it."""
        return self.model_name or self.deployment.public_model

    @property
    def display_title(self) -> str:
        return self.title or "New chat"

    @property
    def is_archived(self) -> bool:
        return self.archived_at is not None


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        # A tool's result in an answer's tool loop (docs/tools.md); its parent is the call's step.
        TOOL = "tool"

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
    image_count = models.PositiveSmallIntegerField(default=0, help_text="Images it carries (MessageImage).")
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        help_text="The message before this one in its branch: a user message's parent is the answer it "
        "follows (None for the first), an answer's the user message it answers. Siblings (the same parent) "
        "are edits and regenerations.",
    )
    text_before = models.TextField(
        blank=True,
        default="",
        editable=False,
        help_text="An answer continued after its length limit: the text it had before its current generation, "
        "which its content starts with.",
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
    # The tool loop's steps (orchestration.tools.loop): an answer's step that called tools keeps its
    # calls in OpenAI's shape; a tool message names the call it answers, its tool, and what the
    # person is shown of it (outcome, output, details), beside `content`, the fenced turn the model read.
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=128, blank=True, default="")
    tool_name = models.CharField(max_length=64, blank=True, default="")
    tool_shown = models.JSONField(default=dict, blank=True)
    # What moderation flagged about it (an input check's flag on a user message, an output check's on
    # an answer), through rows that point down at the flags: `Flag.objects.filter(message=...)`.
    moderation_flags = models.ManyToManyField(
        "moderation.Flag", through="FlaggedMessage", related_name="messages", related_query_name="message"
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


class ConversationFile(models.Model):
    """A file attached to a conversation (not to its owner's library): at most one conversation per
    file, kept here, pointing down at the file."""

    document = models.OneToOneField(
        "documents.Document", on_delete=models.CASCADE, primary_key=True, related_name="conversation_link"
    )
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="file_links")

    def __str__(self) -> str:
        return f"file {self.document_id} in conversation {self.conversation_id}"


class MessageImage(models.Model):
    """An image a user's message carries (a file of theirs, kept by documents), in the order it was
    sent, and how the model that answered took it: as an image (a vision model) or as the text OCR
    read in it (any other), which the page says."""

    class SentAs(models.TextChoices):
        IMAGE = "image"
        TEXT = "text"

    message = models.ForeignKey("Message", on_delete=models.CASCADE, related_name="image_links")
    document = models.ForeignKey("documents.Document", on_delete=models.CASCADE, related_name="message_links")
    ordinal = models.PositiveSmallIntegerField()
    sent_as = models.CharField(max_length=8, choices=SentAs.choices, default=SentAs.TEXT)

    class Meta:
        ordering = ["message_id", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["message", "ordinal"], name="message_image_ordinal_unique")]

    def __str__(self) -> str:
        return f"image {self.document_id} of message {self.message_id}"


class ProjectFile(models.Model):
    """A file of a project, searched for every chat in it: at most one project per file, kept here,
    pointing down at the file, as `ConversationFile` does for a conversation's."""

    document = models.OneToOneField(
        "documents.Document", on_delete=models.CASCADE, primary_key=True, related_name="project_link"
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="file_links")

    def __str__(self) -> str:
        return f"file {self.document_id} in project {self.project_id}"


class ConversationSummary(models.Model):
    """The running summary of a conversation's oldest turns, as of one message: the memory whose
    policy is orchestration.memory's, kept here with the conversation it describes.

    Each summary extends the one before it (`previous`) with the turns that fell out of the window
    since: it covers the branch from the conversation's first message to `through`, and serves any
    prompt whose branch passes through that message (an edit further up starts a branch it does not
    cover). Written by a generation of its own (`purpose` "summary") in the background; until it has
    ended well (`ready`), prompts go on from the previous one, or from the sliding window."""

    class Status(models.TextChoices):
        PENDING = "pending"
        READY = "ready"
        FAILED = "failed"

    # A summary goes with its conversation and with the message it runs to.
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="summaries", db_index=True)
    through = models.ForeignKey(
        Message,
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
        db_table = "orchestration_conversationsummary"  # made by orchestration, which held the summaries first
        ordering = ["-turns_covered", "-id"]
        constraints = [
            # One summary is written at a time per conversation: the claim that starts one.
            models.UniqueConstraint(
                fields=["conversation"], condition=models.Q(status="pending"), name="summary_one_pending"
            )
        ]

    def __str__(self) -> str:
        return f"Summary of conversation {self.conversation_id} through {self.through_id} ({self.status})"


class FlaggedMessage(models.Model):
    """Which message a moderation flag is about: at most one per flag, kept here, beside the
    messages, pointing down at the flag. A message deleted takes its flags with it
    (conversations.flags), as it did when the flag held the key."""

    flag = models.OneToOneField(
        "moderation.Flag", on_delete=models.CASCADE, primary_key=True, related_name="message_link"
    )
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="flag_links")

    def __str__(self) -> str:
        return f"flag {self.flag_id} on message {self.message_id}"


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


class Citation(models.Model):
    """A passage that went into an answer's prompt, numbered as the prompt numbered it ([1], [2] …),
    or one the prompt-injection check left out (`withheld`, no text kept). The file's name and the
    passage are copied, so an answer keeps its sources after the file is deleted. An answer's own
    record, kept here beside it: it goes with the message, and points down at the file."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="citations")
    document = models.ForeignKey(
        "documents.Document", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    number = models.PositiveSmallIntegerField(default=0)
    file_name = models.CharField(max_length=255)
    page = models.PositiveIntegerField(null=True, blank=True)
    heading = models.CharField(max_length=300, blank=True, default="")
    passage = models.TextField(blank=True, default="")
    withheld = models.BooleanField(default=False)

    class Meta:
        db_table = "documents_citation"  # made by documents, which held the citations first
        ordering = ["message_id", "withheld", "number", "id"]
        indexes = [models.Index(fields=["owner", "message"])]

    def __str__(self) -> str:
        return f"[{self.number}] {self.file_name}"


class MessageFeedback(models.Model):
    """A user's rating of an answer, with an optional comment: one per user and message, replaced
    when given again. A dataset for the operator, read in the admin."""

    class Rating(models.TextChoices):
        UP = "up"
        DOWN = "down"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="message_feedback")
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="feedback")
    rating = models.CharField(max_length=8, choices=Rating.choices)
    comment = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["user", "message"], name="message_feedback_one_per_user")]

    def __str__(self) -> str:
        return f"{self.rating} on message {self.message_id}"


class SavedPrompt(models.Model):
    """A prompt its owner keeps for reuse: typing `/` and its command at the start of the chat
    page's composer puts its text there (docs/conversations.md, the prompt library)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_prompts")
    command = models.CharField(max_length=32, help_text="What follows `/` in the composer: a-z, 0-9 and -.")
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["command", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "command"], name="saved_prompt_command_per_owner")]

    def __str__(self) -> str:
        return f"/{self.command}"
