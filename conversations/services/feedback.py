from __future__ import annotations

import logging

from accounts.models import User
from chatsite.errors import ClientError
from conversations.models import Message, MessageFeedback
from conversations.selectors import (
    conversation_get_for_user,
)

logger = logging.getLogger(__name__)


FEEDBACK_COMMENT_CHARS = 2000


def _own_answer(*, user: User, conversation_id: int, message_id: int) -> Message:
    """An answer in a conversation of the user's; anything else (someone else's, a question, a
    message of another conversation) is a 404, as a missing one."""
    conversation = conversation_get_for_user(user=user, conversation_id=conversation_id)
    message = None
    if conversation is not None:
        message = conversation.messages.filter(id=message_id, role=Message.Role.ASSISTANT).first()
    if message is None:
        raise ClientError("That answer does not exist.", code="not_found", status=404, param="message")
    return message


def message_feedback_set(
    *, user: User, conversation_id: int, message_id: int, rating: str, comment: str = ""
) -> MessageFeedback:
    """The user's thumbs up or down (`rating`, one of MessageFeedback.Rating, as the API checks it),
    with an optional comment, on an answer of their own conversation: one per user and answer,
    replaced when given again. Anything else is a 404."""
    message = _own_answer(user=user, conversation_id=conversation_id, message_id=message_id)
    feedback, _ = MessageFeedback.objects.update_or_create(
        user=user, message=message, defaults={"rating": rating, "comment": comment.strip()}
    )
    return feedback


def message_feedback_clear(*, user: User, conversation_id: int, message_id: int) -> None:
    """Take back the user's rating (and its comment) of an answer of their own conversation; one
    never given, or cleared already, is nothing to do. Anything else is a 404."""
    message = _own_answer(user=user, conversation_id=conversation_id, message_id=message_id)
    MessageFeedback.objects.filter(user=user, message=message).delete()
