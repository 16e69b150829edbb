from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from conversations.models import Conversation, Message
from moderation.models import Flag


def conversation_list_for_user(*, user: Any) -> QuerySet[Conversation]:
    return Conversation.objects.filter(user=user).select_related("deployment")


def conversation_get_for_user(*, user: Any, conversation_id: Any) -> Conversation | None:
    """The user's own conversation, or None: another user's conversation looks exactly like a missing one."""
    return _conversation_get(conversation_list_for_user(user=user), conversation_id=conversation_id)


def conversation_get_for_send(*, user: Any, conversation_id: Any) -> Conversation | None:
    """The user's own conversation, as `conversation_get_for_user`, locked for a send into it until
    the transaction ends (PostgreSQL row lock; SQLite locks the database), with its deployment's
    queue length (`deployment.queued_now`, for `generation_admit`): one statement.

    Whether an answer is still being written in it must be read after this, in a statement of its
    own: a send that waited here for another's lock sees that send's rows only in a later statement."""
    from inference.selectors import queue_length_annotation

    conversations = (
        conversation_list_for_user(user=user)
        .select_for_update(of=("self",))
        .annotate(deployment_queued_now=queue_length_annotation())
    )
    conversation = _conversation_get(conversations, conversation_id=conversation_id)
    if conversation is not None:
        conversation.deployment.queued_now = conversation.deployment_queued_now
    return conversation


def _conversation_get(conversations: QuerySet[Conversation], *, conversation_id: Any) -> Conversation | None:
    try:
        conversation_id = int(conversation_id)
        if not 0 < conversation_id < 2**63:  # beyond a bigint, PostgreSQL would refuse the query
            return None
        return conversations.get(id=conversation_id)
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


def default_model_for_user(*, user: Any, allowed: list[Any] | None = None) -> str:
    """The model a new chat of this person starts on: their chosen default while it is enabled and
    their plan includes it, else the service's. `allowed`: the deployments the plan may use, when the
    caller has read them already."""
    from django.conf import settings

    from accounts.selectors import deployments_allowed_for_user, user_settings_get
    from inference.selectors import deployment_list_enabled

    chosen = user_settings_get(user=user).default_model
    if chosen:
        if allowed is None:
            allowed = deployments_allowed_for_user(user=user, deployments=deployment_list_enabled())
        if chosen in {deployment.name for deployment in allowed}:
            return chosen
    return settings.INFERENCE_DEFAULT_DEPLOYMENT
