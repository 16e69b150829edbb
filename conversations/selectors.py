from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from conversations.branches import Tree
from conversations.models import Conversation, Message, MessageFeedback
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


def message_tree(*, conversation: Conversation) -> Tree:
    """Every message of the conversation, every branch, with its generation: one query."""
    return Tree.of(message_list(conversation=conversation))


@dataclass(frozen=True)
class Branch:
    """A branch of a conversation as a reader sees it: its messages, root first, each with
    `siblings` (its own id and its siblings', oldest first) set on it."""

    messages: list[Message]
    tree: Tree


def message_branch(*, conversation: Conversation, through: Any = None) -> Branch | None:
    """The branch on screen (the stored active leaf's, `Tree.active_path`), or with `through` (a
    message id) the newest branch through that message; None when `through` names no message of
    this conversation."""
    tree = message_tree(conversation=conversation)
    if through is None:
        path = tree.active_path(conversation.active_leaf_id)
    elif _is_row_id(through) and through in tree.by_id:
        path = tree.path_to(tree.newest_leaf_under(through))
    else:
        return None
    for message in path:
        message.siblings = tree.siblings(message.id)
    return Branch(path, tree)


def _is_row_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63


def feedback_for_user(*, user: Any, messages: list[Message]) -> dict[int, MessageFeedback]:
    """The user's feedback on any of `messages`, by message id, in one query."""
    ids = [m.id for m in messages if m.role == Message.Role.ASSISTANT]
    if not ids:
        return {}
    return {f.message_id: f for f in MessageFeedback.objects.filter(user=user, message_id__in=ids)}


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
