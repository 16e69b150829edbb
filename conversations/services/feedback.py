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


def message_feedback_set(
    *, user: User, conversation_id: int, message_id: int, rating: str, comment: str = ""
) -> MessageFeedback:
    """The user's thumbs up or down (`rating`, one of MessageFeedback.Rating, as the API checks it),
    with an optional comment, on an answer of their own conversation: one per user and answer,
    replaced when given again. Anything else is a 404."""
    conversation = conversation_get_for_user(user=user, conversation_id=conversation_id)
    message = None
    if conversation is not None:
        message = conversation.messages.filter(id=message_id, role=Message.Role.ASSISTANT).first()
    if message is None:
        raise ClientError("That answer does not exist.", code="not_found", status=404, param="message")
    feedback, _ = MessageFeedback.objects.update_or_create(
        user=user, message=message, defaults={"rating": rating, "comment": comment.strip()}
    )
    return feedback
