"""Reads of what a person's answers and conversations cost them, for the chat page (its data
attributes, the conversation's total) and the socket's `generation.done`. Only ever the owner's: every
read is filtered by the user, so another person's answer or conversation reads as one with no usage."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from functools import cache

from django.db import connection

from accounts.models import User
from accounts.selectors import quota_status_for_user
from billing.models import UsageRecord
from billing.money import money_json
from billing.selectors import (
    PRICE_FIELDS,
    GenerationUsage,
    UsageTotal,
    ledger_money,
    usage_for_generations,
    usage_total_for_generations,
)
from chatsite.parsers import JsonObject
from chatsite.queries import sql_value
from conversations.models import Conversation, Message


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
    total, and what is left of the plan's quota.

    Every answer's end reads these, so the answer's row, its conversation and that conversation's
    total are one statement (`_done_costs_sql`), where they were four: the same figures as
    `usage_for_generations` and `conversation_usage_total` read, and only the owner's."""
    costs: JsonObject = {"cost": None, "quota": quota_status_for_user(user=user).as_json()}
    generation = sql_value(UsageRecord, "generation", uuid.UUID(generation_id))
    with connection.cursor() as cursor:
        cursor.execute(_done_costs_sql(), {"generation": generation, "user": user.id})
        row = cursor.fetchone()
    conversation_id, own_rows, own_cost, own_priced, prompt, completion, total_cost, total_priced = row
    if own_rows and own_priced:
        costs["cost"] = money_json(ledger_money(own_cost))
    if conversation_id is not None:
        total = UsageTotal(
            tokens=(prompt or 0) + (completion or 0), cost=ledger_money(total_cost), priced=bool(total_priced)
        )
        costs["conversation_usage"] = {"conversation": conversation_id, **total.as_json()}
    return costs


@cache  # built once the models are all loaded
def _done_costs_sql() -> str:
    """One row: the conversation of the user's answer written by %(generation)s (NULL: none of the
    user's), the generation's own ledger row (its count, cost and whether it was priced), and the sums
    over the ledger rows of every answer of that conversation. Only the user's rows are read."""
    message, conversation, usage = Message._meta.db_table, Conversation._meta.db_table, UsageRecord._meta.db_table
    priced = " OR ".join(f'u."{name}" > 0' for name in PRICE_FIELDS)
    return f"""
        WITH conv AS (
            SELECT m."conversation_id" AS id FROM "{message}" m
            INNER JOIN "{conversation}" c ON c."id" = m."conversation_id"
            WHERE m."generation_id" = %(generation)s AND c."user_id" = %(user)s
            ORDER BY m."created_at", m."id" LIMIT 1
        ), answers AS (
            SELECT m."generation_id" AS id FROM "{message}" m
            WHERE m."conversation_id" = (SELECT id FROM conv) AND m."generation_id" IS NOT NULL
        ), ledger AS (
            SELECT u."generation_id" = %(generation)s AS own, u."generation_id" IN (SELECT id FROM answers) AS answer,
                u."prompt_tokens", u."completion_tokens", u."cost", ({priced}) AS priced
            FROM "{usage}" u
            WHERE u."user_id" = %(user)s
                AND (u."generation_id" = %(generation)s OR u."generation_id" IN (SELECT id FROM answers))
        )
        SELECT (SELECT id FROM conv),
            COUNT(CASE WHEN own THEN 1 END),
            MAX(CASE WHEN own THEN "cost" END),
            COUNT(CASE WHEN own AND priced THEN 1 END),
            SUM(CASE WHEN answer THEN "prompt_tokens" END),
            SUM(CASE WHEN answer THEN "completion_tokens" END),
            SUM(CASE WHEN answer THEN "cost" END),
            COUNT(CASE WHEN answer AND priced THEN 1 END)
        FROM ledger
    """
