"""What each moderation flag is about, kept beside the messages (`FlaggedMessage`): moderation, the
layer below, records and reads it through this, installed at start-up (moderation.subjects)."""

from __future__ import annotations

import uuid
from typing import Any

from conversations.models import FlaggedMessage, Message
from moderation.subjects import FlagContext


class MessageFlags:
    def message_flagged(self, *, flag_id: int, message: Any) -> None:
        FlaggedMessage.objects.create(flag_id=flag_id, message_id=message.id)

    def answer_flagged(self, *, flag_id: int, generation_id: uuid.UUID | str) -> None:
        message_id = Message.objects.filter(generation_id=generation_id).values_list("id", flat=True).first()
        if message_id is not None:
            FlaggedMessage.objects.create(flag_id=flag_id, message_id=message_id)

    def flag_context(self, *, flag_id: int, before: int) -> FlagContext:
        """The flagged message and the turns that led to it, oldest first: its parents, and where a
        message has none (a conversation's first message, or a user message saved before messages had
        parents) the one before it in the conversation."""
        link = FlaggedMessage.objects.select_related("message__conversation").filter(flag_id=flag_id).first()
        turns: list[Message] = []
        message = link.message if link is not None else None
        while message is not None and len(turns) <= before:
            turns.append(message)
            if message.parent_id is not None:
                message = message.parent
            else:
                message = message.conversation.messages.filter(id__lt=message.id).order_by("-id").first()
        return FlagContext(turns=turns[::-1], message_id=link.message_id if link is not None else None)


MESSAGE_FLAGS = MessageFlags()
