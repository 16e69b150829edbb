"""Reads of what a person's answers and conversations cost them, for the chat page (its data
attributes, the conversation's total) and the socket's `generation.done`. Only ever the owner's: every
read is filtered by the user, so another person's answer or conversation reads as one with no usage."""

from __future__ import annotations

from collections.abc import Iterable

from accounts.models import User
from accounts.selectors import quota_status_for_user
from billing.money import money_json
from billing.selectors import GenerationUsage, UsageTotal, usage_for_generations, usage_total_for_generations
from chatsite.parsers import JsonObject
from conversations.models import Message


def answer_usage_for_messages(*, user: User, messages: Iterable[Message]) -> dict[int, GenerationUsage]:
    """The ledger row of each of the user's answers among `messages` that has one, by message id."""
    by_generation = {str(m.generation_id): m.id for m in messages if m.generation_id is not None}
    usage = usage_for_generations(user_id=user.id, generation_ids=list(by_generation))
    return {by_generation[generation_id]: row for generation_id, row in usage.items()}


def conversation_usage_total(*, user: User, conversation_id: int) -> UsageTotal:
    """Tokens and cost of every answer of the user's conversation, on every branch (all were charged).
    An answer continued after its length limit counts the generation that wrote its latest part."""
    generations = Message.objects.filter(conversation_id=conversation_id, conversation__user_id=user.id).values_list(
        "generation_id", flat=True
    )
    return usage_total_for_generations(user_id=user.id, generation_ids=[g for g in generations if g is not None])


def generation_done_costs(*, user: User, generation_id: str) -> JsonObject:
    """What the chat socket adds to an answer's `generation.done` for its owner: the answer's cost
    (null where the plan does not price its tokens, or it has no ledger row), its conversation's new
    total, and what is left of the plan's quota."""
    costs: JsonObject = {"cost": None, "quota": quota_status_for_user(user=user).as_json()}
    row = usage_for_generations(user_id=user.id, generation_ids=[generation_id]).get(generation_id)
    if row is not None and row.priced:
        costs["cost"] = money_json(row.cost)
    conversation_id = (
        Message.objects.filter(generation_id=generation_id, conversation__user_id=user.id)
        .values_list("conversation_id", flat=True)
        .first()
    )
    if conversation_id is not None:
        total = conversation_usage_total(user=user, conversation_id=conversation_id)
        costs["conversation_usage"] = {"conversation": conversation_id, **total.as_json()}
    return costs
