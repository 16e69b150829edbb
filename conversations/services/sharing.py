from __future__ import annotations

import logging
import secrets

from django.db import IntegrityError, transaction

from conversations.models import Conversation, Message, SharedConversation
from conversations.selectors import (
    message_tree_for_prompt,
)

logger = logging.getLogger(__name__)


def conversation_share(*, conversation: Conversation) -> SharedConversation:
    """A read-only link to a snapshot of the branch on screen now (the one the chat page shows,
    `Tree.active_path`); the link it has, if it has one (revoke it to share a newer snapshot). Its
    token is 256 random bits. Other branches (a question edited away and its answers, the other
    regenerations of an answer) stay out, and so does text that was not shown as the
    conversation's own: messages moderation held back, and answers still being written or without
    text."""
    existing = SharedConversation.objects.filter(conversation=conversation).first()
    if existing is not None:
        return existing
    branch = message_tree_for_prompt(conversation=conversation).active_path(conversation.active_leaf_id)
    snapshot = [{"role": m.role, "content": m.content} for m in branch if _shown_in_share(m)]
    try:
        with transaction.atomic():
            return SharedConversation.objects.create(
                conversation=conversation,
                token=secrets.token_urlsafe(32),
                title=conversation.display_title,
                messages=snapshot,
            )
    except IntegrityError:  # shared at the same moment from another tab: that share is the one
        return SharedConversation.objects.get(conversation=conversation)


def _shown_in_share(message: Message) -> bool:
    if message.role not in (Message.Role.USER, Message.Role.ASSISTANT) or not message.content:
        return False
    if message.is_in_progress:
        return False
    return not (message.role == Message.Role.USER and message.status == Message.Status.FLAGGED)


def conversation_share_revoke(*, conversation: Conversation) -> bool:
    """Take the conversation's shared link down: it answers 404 from now on. False if it had none."""
    deleted, _ = SharedConversation.objects.filter(conversation=conversation).delete()
    return bool(deleted)
