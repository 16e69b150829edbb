"""Conversation titles: the short request that asks the model for one, and what is kept of its answer.

The model writes a title from a conversation's first exchange once its first answer has ended
(conversations.services.conversation_title_request). What it writes is cleaned to one plain line of
a few words (`title_clean`); when it writes nothing usable, or the request fails, the title is the
first words of the first message (`title_from_message`). A message moderation held back never
becomes a title: it has no answer, and no title is asked for until one ends.
"""

from __future__ import annotations

import re

TITLE_MAX_CHARS = 60
# What the model is shown of the exchange: enough to name it, little enough to stay a short request.
EXCHANGE_CHARS = 600
TITLE_MAX_TOKENS = 16
TITLE_TEMPERATURE = 0.3

_LABEL = re.compile(r"^\s*(?:conversation\s+)?title\s*[:\-–—]\s*", re.IGNORECASE)
_WRAPPERS = "\"'`*_#“”‘’«»[]()<> \t"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def title_prompt_messages(*, user_text: str, answer_text: str) -> list[dict[str, str]]:
    """The chat the model is asked to title: the exchange quoted as material, and one instruction."""
    return [
        {"role": "system", "content": "You name conversations. Reply with a short title only."},
        {
            "role": "user",
            "content": (
                "Write a title of three to six words for this conversation.\n\n"
                f"User: {_shortened(user_text)}\n"
                f"Assistant: {_shortened(answer_text)}\n\n"
                "Reply with the title only, without quotes."
            ),
        },
    ]


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


def _shortened(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCHANGE_CHARS else text[:EXCHANGE_CHARS] + "…"
