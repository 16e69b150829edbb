from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q, QuerySet

from moderation.defaults import DEFAULT_RULES
from moderation.models import Flag, ModerationPolicy


@dataclass(frozen=True)
class PolicySnapshot:
    """A policy read once, free of the ORM, so the streaming loop can consult it without queries."""

    policy_id: int | None
    name: str
    rules: dict[str, tuple[float, str]]
    moderate_input: bool = True
    moderate_output: bool = True


def policy_for_user(*, user: Any) -> PolicySnapshot:
    """The active policy for the user's tier, else the active global one, else the built-in defaults."""
    from accounts.selectors import tier_for_user_or_none

    tier = tier_for_user_or_none(user=user)
    applies = Q(tier__isnull=True) if tier is None else Q(tier__isnull=True) | Q(tier=tier)
    candidates = ModerationPolicy.objects.filter(applies, is_active=True).prefetch_related("rules")
    chosen = None
    for policy in candidates:
        if chosen is None or policy.tier_id is not None:
            chosen = policy
    if chosen is None:
        return PolicySnapshot(policy_id=None, name="built-in defaults", rules=dict(DEFAULT_RULES))
    return PolicySnapshot(
        policy_id=chosen.id,
        name=chosen.name,
        rules={rule.category: (rule.threshold, rule.action) for rule in chosen.rules.all()},
        moderate_input=chosen.moderate_input,
        moderate_output=chosen.moderate_output,
    )


def flag_list_for_review() -> QuerySet[Flag]:
    return Flag.objects.select_related("user", "reviewer", "message__conversation", "policy")


def flag_context(*, flag: Flag, before: int = 6) -> list[Any]:
    """The flagged message and the turns just before it in its conversation, oldest first."""
    if flag.message is None:
        return []
    from conversations.selectors import message_list

    messages = [m for m in message_list(conversation=flag.message.conversation) if m.id <= flag.message.id]
    return messages[-(before + 1) :]
