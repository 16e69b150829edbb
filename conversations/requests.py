"""What a client asks of the conversations app, checked once, where it enters (the chat socket's
frames, the send API's body), into small frozen, typed requests. A request that exists is a valid
one: the services take these and never look at a raw value again.

`parse` turns a frame's or a body's fields (anything JSON can hold) into a request, refusing what
is not one with a `ClientError` that names the field; the constructor checks the values themselves
(a message's text, an id's range), so a request built in code is held to the same rules.
"""

from __future__ import annotations

import enum
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeGuard

from django.conf import settings

from chatsite.errors import ClientError
from orchestration.tools.base import TOOL_NAME


class ActiveBranch(enum.Enum):
    """A send's `parent` when the request names none: the leaf of the branch last shown or answered."""

    ACTIVE_BRANCH = "active"

    def __repr__(self) -> str:
        return "ACTIVE_BRANCH"


ACTIVE_BRANCH: Final = ActiveBranch.ACTIVE_BRANCH
# What a new message follows: a message's id, None (a new branch from the beginning), or the branch on screen.
Parent = int | None | ActiveBranch

# The longest model name a request may give; a longer one names no model.
MODEL_NAME_CHARS = 100


def is_row_id(value: object) -> TypeGuard[int]:
    """A value a query may compare with an id: an integer (not a bool) that fits a bigint, which
    SQLite and PostgreSQL would otherwise refuse with an error of their own."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63


def is_integer(value: object) -> TypeGuard[int]:
    """An integer, as JSON has it: Python's True and False are ints too, and mean no id."""
    return isinstance(value, int) and not isinstance(value, bool)


def message_content_clean(content: object) -> str:
    """A message's text, trimmed; refused when it is not text, is empty, holds NUL (PostgreSQL
    refuses it outright) or is longer than CHAT_MAX_MESSAGE_CHARS."""
    if not isinstance(content, str):
        raise ClientError("A message must be text.", code="invalid_message", param="content")
    if "\x00" in content:
        raise ClientError("A message cannot contain NUL characters.", code="invalid_message", param="content")
    content = content.strip()
    if not content:
        raise ClientError("A message cannot be empty.", code="invalid_message", param="content")
    if len(content) > settings.CHAT_MAX_MESSAGE_CHARS:
        raise ClientError(
            f"A message can be at most {settings.CHAT_MAX_MESSAGE_CHARS} characters long.",
            code="message_too_long",
            param="content",
        )
    return content


def model_name_check(model: str | None) -> None:
    """A request's model name, refused when it cannot be one (NUL, or longer than any name)."""
    if model is not None and ("\x00" in model or len(model) > MODEL_NAME_CHARS):
        raise ClientError("'model' must be a model name.", code="invalid_request", param="model")


def model_name_parse(value: object) -> str | None:
    """A request's optional `model` field: a model name, or None."""
    if value is not None and not isinstance(value, str):
        raise ClientError("'model' must be a model name.", code="invalid_request", param="model")
    model_name_check(value)
    return value


def uuid_parse(value: object, *, param: str) -> uuid.UUID | None:
    """A request's optional UUID field (text), refused with a clear error when it is anything else."""
    if value is None or isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ClientError(f"'{param}' must be a UUID.", code="invalid_request", param=param)


@dataclass(frozen=True)
class SendRequest:
    """A message to send (`conversations.services.message_send`).

    `conversation_id`: the conversation it goes into; None starts one. `model`: the model to answer
    it (None: the conversation's, or the plan's default). `client_id`: the sender's own id for the
    message, which makes the send safe to repeat; `retry`: it may have been sent before, so the id
    is looked up first. `parent`: the message it follows (conversations.branches). `project_id`: the
    project a new conversation starts in (its instructions, files and default model)."""

    content: str
    conversation_id: int | None = None
    model: str | None = None
    client_id: uuid.UUID | None = None
    parent: Parent = ACTIVE_BRANCH
    retry: bool = False
    project_id: int | None = None
    # The user's images (their files' ids) the message carries, in order.
    images: tuple[int, ...] = ()
    # The conversation's tools switched on or off with this message (None: as they are), and a tool
    # the person asked for by name, which the answer's first step must call (docs/tools.md).
    tools: bool | None = None
    tool: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", message_content_clean(self.content))
        if len(self.images) > settings.API_MAX_IMAGES or not all(is_row_id(i) for i in self.images):
            raise ClientError(
                f"'images' must be a list of at most {settings.API_MAX_IMAGES} image ids.",
                code="invalid_request",
                param="images",
            )
        if self.tool is not None and not TOOL_NAME.match(self.tool):
            raise ClientError("'tool' must be a tool's name.", code="invalid_request", param="tool")
        model_name_check(self.model)
        if self.parent is not ACTIVE_BRANCH and self.parent is not None and not is_row_id(self.parent):
            raise ClientError("'parent' must be a message id or null.", code="invalid_request", param="parent")
        if self.conversation_id is None and self.parent not in (ACTIVE_BRANCH, None):
            raise ClientError("A 'parent' needs the 'conversation' it is in.", code="invalid_parent", param="parent")
        if self.project_id is not None and not is_row_id(self.project_id):
            raise ClientError("That project does not exist.", code="not_found", status=404, param="project")
        if self.project_id is not None and self.conversation_id is not None:
            raise ClientError(
                "A 'project' is for a new conversation; move a conversation into one instead.",
                code="invalid_request",
                param="project",
            )

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> SendRequest:
        """From a `message.send` frame or the send API's body: `content`, and optionally
        `conversation` (an id), `model`, `client_id` (a UUID), `parent` (an id or null), `retry`,
        `project` (an id, for a new conversation), `images` (ids of the user's images), `tools` (true or
        false: the conversation's tools on or off) and `tool` (the name of a tool the answer must call first)."""
        conversation = fields.get("conversation")
        if conversation is not None and not is_integer(conversation):
            raise ClientError("'conversation' must be a conversation id.", code="invalid_request", param="conversation")
        model = model_name_parse(fields.get("model"))
        retry = fields.get("retry", False)
        if not isinstance(retry, bool):
            raise ClientError("'retry' must be true or false.", code="invalid_request", param="retry")
        parent = fields.get("parent", ACTIVE_BRANCH)
        if parent is not ACTIVE_BRANCH and parent is not None and not is_integer(parent):
            raise ClientError("'parent' must be a message id or null.", code="invalid_request", param="parent")
        project = fields.get("project")
        if project is not None and not is_integer(project):
            raise ClientError("'project' must be a project id.", code="invalid_request", param="project")
        images = fields.get("images", [])
        if not isinstance(images, list) or not all(is_integer(i) for i in images):
            raise ClientError("'images' must be a list of image ids.", code="invalid_request", param="images")
        tools = fields.get("tools")
        if tools is not None and not isinstance(tools, bool):
            raise ClientError("'tools' must be true or false.", code="invalid_request", param="tools")
        tool = fields.get("tool")
        if tool is not None and not (isinstance(tool, str) and TOOL_NAME.match(tool)):
            raise ClientError("'tool' must be a tool's name.", code="invalid_request", param="tool")
        return cls(
            images=tuple(images),
            content=message_content_clean(fields.get("content")),
            project_id=project,
            conversation_id=conversation,
            model=model,
            client_id=uuid_parse(fields.get("client_id"), param="client_id"),
            parent=parent,
            retry=retry,
            tools=tools,
            tool=tool,
        )


@dataclass(frozen=True)
class AnswerRequest:
    """An answer to regenerate or continue (`message_regenerate`, `message_continue`).

    `replaces`: the generation of the newest answer the client knows of (for a regenerate) or shows
    (for a continue); a request repeated after it was carried out is answered with what it did.
    `model`: a regenerate's model, when another than the conversation's is to write the new answer
    (None: the conversation's); a continue goes on with the model the answer is written by."""

    message_id: int
    replaces: uuid.UUID | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        model_name_check(self.model)

    @classmethod
    def parse(cls, fields: Mapping[str, object], *, with_model: bool = False) -> AnswerRequest:
        """From a `message.regenerate` frame (`with_model`) or a `message.continue` one: `message` (an
        answer's id) and optionally `replaces` (a generation's id) and, for a regenerate, `model`. An
        id that names no answer is a 404, as an answer of someone else's is."""
        replaces = uuid_parse(fields.get("replaces"), param="replaces")
        message = fields.get("message")
        if not is_row_id(message):
            raise ClientError("That answer does not exist.", code="not_found", status=404, param="message")
        if not with_model and fields.get("model") is not None:
            raise ClientError(
                "A continued answer goes on with the model that wrote it: 'model' is for a regenerate.",
                code="invalid_request",
                param="model",
            )
        return cls(message_id=message, replaces=replaces, model=model_name_parse(fields.get("model")))


@dataclass(frozen=True)
class ConversationSettingsRequest:
    """A conversation's own settings (`conversation_settings_update`): its `system_prompt` ("" for
    none) and the `temperature` of its answers (None: the model's own). Only their types are checked
    here; their limits are the plan's, which the service checks."""

    system_prompt: str = ""
    temperature: float | None = None

    def __post_init__(self) -> None:
        if "\x00" in self.system_prompt:
            raise ClientError(
                "A system prompt cannot contain NUL characters.", code="invalid_request", param="system_prompt"
            )
        object.__setattr__(self, "system_prompt", self.system_prompt.strip())
        if self.temperature is not None and not math.isfinite(self.temperature):
            raise ClientError("'temperature' must be a number or null.", code="invalid_request", param="temperature")

    @classmethod
    def parse(cls, fields: object) -> ConversationSettingsRequest:
        """From the settings API's body: `system_prompt` (text) and `temperature` (a number or null),
        each left out for its default."""
        if not isinstance(fields, Mapping):
            raise ClientError("Send a JSON object.", code="invalid_request")
        system_prompt = fields.get("system_prompt", "")
        if not isinstance(system_prompt, str):
            raise ClientError("'system_prompt' must be text.", code="invalid_request", param="system_prompt")
        temperature = fields.get("temperature")
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)):
            raise ClientError("'temperature' must be a number or null.", code="invalid_request", param="temperature")
        return cls(system_prompt=system_prompt, temperature=None if temperature is None else float(temperature))


# A saved prompt's command: what follows `/` in the composer, so nothing a person types there twice.
PROMPT_COMMAND = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
PROMPT_TEXT_CHARS = 4000


@dataclass(frozen=True)
class SavedPromptRequest:
    """A saved prompt as its owner writes it: a command (lower-case letters, digits and `-`, at most
    32) and the text it puts into the composer (at most PROMPT_TEXT_CHARS)."""

    command: str
    text: str

    def __post_init__(self) -> None:
        if not PROMPT_COMMAND.fullmatch(self.command):
            raise ClientError(
                "A command is 1 to 32 lower-case letters, digits or hyphens, starting with a letter or digit.",
                code="invalid_command",
                param="command",
            )
        if not self.text or "\x00" in self.text:
            raise ClientError("A prompt's text cannot be empty.", code="invalid_text", param="text")
        if len(self.text) > PROMPT_TEXT_CHARS:
            raise ClientError(
                f"A prompt's text can be at most {PROMPT_TEXT_CHARS} characters long.",
                code="invalid_text",
                param="text",
            )

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> SavedPromptRequest:
        """From a body or a form: `command` (a leading `/` and surrounding spaces are forgiven, and
        upper case is lowered) and `text` (trimmed)."""
        command, text = fields.get("command"), fields.get("text")
        if not isinstance(command, str):
            raise ClientError("'command' must be text.", code="invalid_command", param="command")
        if not isinstance(text, str):
            raise ClientError("'text' must be text.", code="invalid_text", param="text")
        return cls(command=command.strip().removeprefix("/").lower(), text=text.strip())


# How the person answers a tool call with side effects (conversations.tool_loops).
TOOL_DECISIONS = ("once", "chat", "deny")
# The longest call id a request may name (`Message.tool_call_id`).
TOOL_CALL_ID_CHARS = 128


@dataclass(frozen=True)
class ToolStepRequest:
    """A request about one step of an answer's tool loop, sent while its calls wait or run: the
    person's answer to a call with side effects (`call` and `decision`), or a Stop (neither)."""

    generation: uuid.UUID
    call: str | None = None
    decision: str | None = None

    def __post_init__(self) -> None:
        if self.call is not None and not 0 < len(self.call) <= TOOL_CALL_ID_CHARS:
            raise ClientError("'call' must be the id of a tool call.", code="invalid_request", param="call")
        if self.decision is not None and self.decision not in TOOL_DECISIONS:
            raise ClientError("'decision' must be once, chat or deny.", code="invalid_request", param="decision")
        if (self.call is None) != (self.decision is None):
            raise ClientError("An answer names its 'call' and its 'decision'.", code="invalid_request")

    @classmethod
    def parse(cls, fields: Mapping[str, object], *, approval: bool) -> ToolStepRequest:
        """From an approval's body (`generation`, `call`, `decision`, all required) or a Stop's
        (`generation`); any other field is refused."""
        allowed = {"generation", "call", "decision"} if approval else {"generation"}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise ClientError(f"Unknown field '{unknown[0][:100]}'.", code="invalid_request", param=unknown[0][:100])
        generation = uuid_parse(fields.get("generation"), param="generation")
        if generation is None:
            raise ClientError("'generation' must be a UUID.", code="invalid_request", param="generation")
        if not approval:
            return cls(generation=generation)
        call, decision = fields.get("call"), fields.get("decision")
        if not isinstance(call, str):
            raise ClientError("'call' must be the id of a tool call.", code="invalid_request", param="call")
        if not isinstance(decision, str):
            raise ClientError("'decision' must be once, chat or deny.", code="invalid_request", param="decision")
        return cls(generation=generation, call=call, decision=decision)
