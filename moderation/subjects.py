"""What a flag is about: the message, which lives in conversations, the layer above.

A flag holds no key to it; conversations keeps which message each flag is about (its
`FlaggedMessage` rows, pointing down at the flag) and installs itself here at start-up (its
AppConfig.ready), so moderation records and shows a flag's message without importing it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class FlagContext:
    """The flagged message and the turns that led to it, oldest first, for a review."""

    turns: list[Any]
    message_id: int | None


class FlagSubject(Protocol):
    """A message, as moderation sees one (conversations' Message is one): its id."""

    @property
    def id(self) -> int: ...


class FlagSubjects(Protocol):
    def message_flagged(self, *, flag_id: int, message: FlagSubject) -> None:
        """Record that the flag is about `message` (a flag made with the message at hand)."""
        ...

    def answer_flagged(self, *, flag_id: int, generation_id: uuid.UUID | str) -> None:
        """Record that the flag is about the answer `generation_id` writes, if it has a message."""
        ...

    def flag_context(self, *, flag_id: int, before: int) -> FlagContext:
        """The flag's message and up to `before` turns before it (none when it has no message)."""
        ...


_installed: list[FlagSubjects] = []


def flag_subjects_install(subjects: FlagSubjects) -> None:
    _installed[:] = [subjects]


def flag_subjects() -> FlagSubjects:
    if not _installed:
        raise ImproperlyConfigured("Nothing records what flags are about: add 'conversations' to INSTALLED_APPS.")
    return _installed[0]
