from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

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


def user_tier_name(*, user: Any) -> str:
    """The name of the user's plan (the default plan when none is set); policies are keyed on it."""
    from accounts.selectors import tier_for_user_or_none

    tier = tier_for_user_or_none(user=user)
    return tier.name if tier is not None else ""


def policy_for_user(*, user: Any) -> PolicySnapshot:
    """The active policy for the user's tier, else the active global one, else the built-in defaults."""
    tier_name = user_tier_name(user=user)
    candidates = ModerationPolicy.objects.filter(is_active=True, tier_name__in={tier_name, ""}).prefetch_related(
        "rules"
    )
    chosen = None
    for policy in candidates:
        if chosen is None or policy.tier_name:
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
