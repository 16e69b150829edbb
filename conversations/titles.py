"""Conversation titles: the short request that asks the model for one, and what is kept of its answer.

The model writes a title from a conversation's first exchange once its first answer has ended
(conversations.services.conversation_title_request), as one JSON object, `{"title": "..."}`, which
the engine's structured output holds it to (TITLE_SCHEMA: the OpenAI API's `response_format`
`json_schema` path). Free text let a small model answer the question instead of naming it, and the
title was the answer's first words cut mid-sentence. What it writes is checked (`title_from_model`:
the JSON parsed, the title cleaned to one plain line, and refused when it is no plausible title);
when it is unusable, or the request fails, the title is the first words of the first message
(`title_from_message`). A message moderation held back never becomes a title: it has no answer,
and no title is asked for until one ends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

TITLE_MAX_CHARS = 60
# A title of more words than this is a sentence, not a name.
TITLE_MAX_WORDS = 10
# The answer's first words, repeated as its "title", are the fragment titles must never be.
ECHO_MIN_WORDS = 3
# What the model is shown of the exchange: enough to name it, little enough to stay a short request.
EXCHANGE_CHARS = 600
# The JSON around the title costs about six tokens; a title cut at this limit is unusable JSON.
TITLE_MAX_TOKENS = 24
TITLE_TEMPERATURE = 0.3
TITLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"title": {"type": "string", "minLength": 1, "maxLength": TITLE_MAX_CHARS}},
    "required": ["title"],
    "additionalProperties": False,
}
# vLLM's StructuredOutputsParams fields (as the OpenAI API's `response_format` sets them), compact:
# a small model left free to write whitespace between the braces may spend its tokens on it.
TITLE_STRUCTURED_OUTPUTS: dict[str, Any] = {"json": TITLE_SCHEMA, "disable_any_whitespace": True}

_LABEL = re.compile(r"^\s*(?:conversation\s+)?title\s*[:\-–—]\s*", re.IGNORECASE)
_WRAPPERS = "\"'`*_#“”‘’«»[]()<> \t"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def title_prompt_messages(*, user_text: str, answer_text: str) -> list[dict[str, str]]:
    """The chat the model is asked to title: the exchange quoted as material, and one instruction."""
    return [
        {"role": "system", "content": "You name conversations. Reply with JSON only."},
        {
            "role": "user",
            "content": (
                "Name this conversation with a title of three to six words. Do not answer it.\n\n"
                f"User: {_shortened(user_text)}\n"
                f"Assistant: {_shortened(answer_text)}\n\n"
                'Reply as JSON: {"title": "<the title>"}'
            ),
        },
    ]


def title_from_model(text: str, *, answers: Iterable[str] = ()) -> str:
    """The title in what the model wrote (TITLE_SCHEMA's object), cleaned; empty when there is no
    usable one: not that JSON (a reply cut at its length limit), too long to be a name (more than
    TITLE_MAX_WORDS words or TITLE_MAX_CHARS characters: cutting it would leave a fragment), without
    a letter, or the opening words of one of the conversation's `answers` (the model answered
    instead of naming)."""
    try:
        value = json.loads(text)
    except ValueError:
        return ""
    raw = value.get("title") if isinstance(value, dict) else None
    if not isinstance(raw, str):
        return ""
    words = raw.split()
    if len(words) > TITLE_MAX_WORDS or len(" ".join(words)) > TITLE_MAX_CHARS:
        return ""
    title = title_clean(raw)
    if not any(ch.isalpha() for ch in title):
        return ""
    said = _plain_words(title)
    if len(said) >= ECHO_MIN_WORDS and any(_plain_words(answer)[: len(said)] == said for answer in answers):
        return ""
    return title


def title_clean(text: str) -> str:
    """One plain line of at most TITLE_MAX_CHARS, cut at a word: no label ("Title:"), no quotes or
    markdown around it, no trailing full stop. Empty when nothing with a letter or digit is left."""
    lines = [line for line in (_CONTROL.sub(" ", raw).strip() for raw in text.splitlines()) if line]
    if not lines:
        return ""
    line = _LABEL.sub("", lines[0])
    line = " ".join(line.split()).strip(_WRAPPERS).rstrip(".,;:!-–— ").strip(_WRAPPERS)
    line = line.replace('"', "").replace("“", "").replace("”", "")
    if not any(ch.isalnum() for ch in line):
        return ""
    return _cut_at_word(line, TITLE_MAX_CHARS)


def title_from_message(content: str) -> str:
    """The fallback title: the first words of the message, on one line."""
    line = " ".join(_CONTROL.sub(" ", content).split())
    if len(line) <= TITLE_MAX_CHARS:
        return line
    return _cut_at_word(line, TITLE_MAX_CHARS - 1) + "…"


def _cut_at_word(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    cut = line[:limit]
    space = cut.rfind(" ")
    return (cut[:space] if space >= limit // 2 else cut).rstrip(" ,;:-–—")


def _plain_words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def _shortened(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCHANGE_CHARS else text[:EXCHANGE_CHARS] + "…"
