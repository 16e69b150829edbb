from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from conversations.models import Conversation, Message
from moderation.models import Flag


def conversation_list_for_user(*, user: Any) -> QuerySet[Conversation]:
    return Conversation.objects.filter(user=user).select_related("deployment")


def conversation_get_for_user(*, user: Any, conversation_id: Any) -> Conversation | None:
    """The user's own conversation, or None: another user's conversation looks exactly like a missing one."""
    try:
        conversation_id = int(conversation_id)
        if not 0 < conversation_id < 2**63:  # beyond a bigint, PostgreSQL would refuse the query
            return None
        return conversation_list_for_user(user=user).get(id=conversation_id)
    except (Conversation.DoesNotExist, TypeError, ValueError, OverflowError):
        return None


def message_list(*, conversation: Conversation) -> list[Message]:
    return list(conversation.messages.select_related("generation").all())


def held_back_flags(*, messages: list[Message]) -> dict[int, Flag]:
    """The input flag of each of `messages` that moderation held back, by message id, in one query."""
    held = [m.id for m in messages if m.role == Message.Role.USER and m.status == Message.Status.FLAGGED]
    if not held:
        return {}
    flags = Flag.objects.filter(message_id__in=held, source=Flag.Source.INPUT).order_by("-id")
    return {flag.message_id: flag for flag in flags}  # newest first, so a message's first flag wins


def conversation_has_message_in_progress(*, conversation: Conversation) -> bool:
    return conversation.messages.filter(status__in=Message.IN_PROGRESS).exists()


def message_for_generation(*, generation_id: Any) -> Message | None:
    return Message.objects.filter(generation_id=generation_id).first()
