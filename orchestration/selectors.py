from __future__ import annotations

from collections.abc import Collection

from orchestration.models import ConversationSummary


def summary_for_branch(*, conversation_id: int, message_ids: Collection[int]) -> ConversationSummary | None:
    """The newest ready summary of the conversation that runs to a message of this branch: one that
    ran to another branch's message says nothing of this one."""
    if not message_ids:
        return None
    return (
        ConversationSummary.objects.filter(
            conversation_id=conversation_id,
            status=ConversationSummary.Status.READY,
            through_id__in=list(message_ids),
        )
        .order_by("-turns_covered", "-id")
        .first()
    )
