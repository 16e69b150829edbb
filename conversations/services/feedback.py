from __future__ import annotations

import logging
from typing import Any

from accounts.models import User
from chatsite.errors import ClientError
from conversations.models import Message, MessageFeedback
from conversations.selectors import (
    conversation_get_for_user,
)
from conversations.services.conversations import is_row_id

logger = logging.getLogger(__name__)


FEEDBACK_COMMENT_CHARS = 2000


def message_feedback_set(
    *, user: User, conversation_id: Any, message_id: Any, rating: Any, comment: Any = ""
) -> MessageFeedback:
    """The user's thumbs up or down, with an optional comment, on an answer of their own
    conversation: one per user and answer, replaced when given again. Anything else is a 404."""
    if rating not in MessageFeedback.Rating.values:
        raise ClientError("'rating' must be 'up' or 'down'.", code="invalid_request", param="rating")
    if comment is None:
        comment = ""
    if not isinstance(comment, str) or "\x00" in comment or len(comment) > FEEDBACK_COMMENT_CHARS:
        raise ClientError(
            f"'comment' must be text of at most {FEEDBACK_COMMENT_CHARS} characters.",
            code="invalid_request",
            param="comment",
        )
    conversation = conversation_get_for_user(user=user, conversation_id=conversation_id)
    message = None
    if conversation is not None and is_row_id(message_id):
        message = conversation.messages.filter(id=message_id, role=Message.Role.ASSISTANT).first()
    if message is None:
        raise ClientError("That answer does not exist.", code="not_found", status=404, param="message")
    feedback, _ = MessageFeedback.objects.update_or_create(
        user=user, message=message, defaults={"rating": rating, "comment": comment.strip()}
    )
    return feedback
