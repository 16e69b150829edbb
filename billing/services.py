"""Writes to the ledger: a finished generation charged exactly once, and the rows of the requests
and the work that are not generations (moderation, embeddings, a file's processing)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal

from django.utils import timezone

from accounts.models import User
from accounts.selectors import tier_for_user, tier_for_user_id_or_none
from billing.models import UsageRecord
from billing.selectors import tier_prices_for_user_id, usage_tokens_since_each
from chatsite.queries import insert_unless_conflicting
from inference.models import Generation, ModelDeployment

COST_PLACES = Decimal("0.000001")


def usage_record(*, generation: Generation) -> UsageRecord | None:
    """Charge a finished generation exactly once, at its user's tier's prices for its deployment.

    A conversation's title (`purpose` "title") is the service's own request, which the user did not
    make: it is neither charged nor recorded (None), so it never shows on a statement or counts
    towards a quota. A conversation's summary (`purpose` "summary", orchestration.memory) is the
    service's own work too, and the house pays for it; an answer played back from the response cache
    (`cached`) ran no engine. Both are recorded with their tokens (kind "summary", "cached"), at no
    cost, and do not count towards the quotas (`usage_billable`).

    Tokens are the engine's counts. A generation that never reached an engine (stopped while queued)
    used none; a failed one is recorded for the books but not charged. A second call for the same
    generation (a retried task, a duplicate signal) returns the existing row and charges nothing.
    It reads only the generation's own fields (ids included), so a row fresh from an update will do.
    """
    if not generation.is_finished:
        raise ValueError("only a finished generation can be charged")
    if getattr(generation, "purpose", "answer") == "title":
        return None
    # Never raise here: this runs inside generation_finish, and a missing tier must not undo a finish.
    prices = tier_prices_for_user_id(user_id=generation.user_id, deployment_id=generation.deployment_id)
    ran = generation.started_at is not None
    prompt_tokens = generation.prompt_tokens if ran else 0
    cached_tokens = min(getattr(generation, "cached_tokens", 0), prompt_tokens)
    completion_tokens = generation.completion_tokens if ran else 0
    kind = UsageRecord.Kind.GENERATION
    if getattr(generation, "purpose", "answer") == "summary":
        kind = UsageRecord.Kind.SUMMARY
    elif getattr(generation, "cached", False):
        kind = UsageRecord.Kind.CACHED
    cost = Decimal("0")
    if generation.status != "failed" and kind == UsageRecord.Kind.GENERATION:
        # The prompt's cached tokens at the cached price, the rest at the prompt price.
        cost = (
            Decimal(prompt_tokens - cached_tokens) * prices.prompt_per_1k / 1000
            + Decimal(cached_tokens) * prices.cached_per_1k / 1000
            + Decimal(completion_tokens) * prices.completion_per_1k / 1000
        ).quantize(COST_PLACES, rounding=ROUND_HALF_UP)
    record = UsageRecord(
        generation_id=generation.id,
        user_id=generation.user_id,
        kind=kind,
        deployment_id=generation.deployment_id,
        tier_id=prices.tier_id,
        status=generation.status,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        prompt_price_per_1k=prices.prompt_per_1k if kind == UsageRecord.Kind.GENERATION else Decimal("0"),
        cached_price_per_1k=prices.cached_per_1k if kind == UsageRecord.Kind.GENERATION else Decimal("0"),
        completion_price_per_1k=prices.completion_per_1k if kind == UsageRecord.Kind.GENERATION else Decimal("0"),
        cost=cost,
        created_at=generation.finished_at or timezone.now(),
    )
    # The one-to-one on the generation is what guarantees a single row, even when two charges race:
    # the second insert inserts nothing (ON CONFLICT DO NOTHING, no savepoint needed), and the row
    # already there is the charge.
    if insert_unless_conflicting(record):
        return record
    return UsageRecord.objects.get(generation_id=generation.id)


def usage_records_outlive(*, user_id: int) -> int:
    """Keep an account's ledger when the account goes: its records are numbered by the account's id
    (`former_account`) and lose the link to it (SET_NULL). They hold no content, only what was used
    and charged, which an operator must keep for accounting."""
    return UsageRecord.objects.filter(user_id=user_id).update(former_account=user_id)


def moderation_record(*, user_id: int, tier_id: int | None, tokens: int) -> UsageRecord:
    """The ledger row of a /v1/moderations request (accounts.services.moderation_admit admits it):
    its input's tokens, free of charge; the row is what makes the quotas count them."""
    return UsageRecord.objects.create(
        user_id=user_id,
        kind=UsageRecord.Kind.MODERATION,
        tier_id=tier_id,
        status="complete",
        prompt_tokens=tokens,
    )


def embedding_record(*, user_id: int, deployment_id: int, tokens: int) -> UsageRecord:
    """The ledger row of an embeddings request: its input tokens at the tier's prompt price for the
    deployment (an embedding has no output tokens)."""
    prices = tier_prices_for_user_id(user_id=user_id, deployment_id=deployment_id)
    cost = (Decimal(tokens) * prices.prompt_per_1k / 1000).quantize(COST_PLACES, rounding=ROUND_HALF_UP)
    return UsageRecord.objects.create(
        user_id=user_id,
        kind=UsageRecord.Kind.EMBEDDING,
        deployment_id=deployment_id,
        tier_id=prices.tier_id,
        status="complete",
        prompt_tokens=tokens,
        prompt_price_per_1k=prices.prompt_per_1k,
        cost=cost,
    )


def tool_usage_record(*, user_id: int, cost: Decimal) -> UsageRecord:
    """The ledger row of a tool call in an answer's tool loop: the tool's own cost, no tokens."""
    return UsageRecord.objects.create(
        user_id=user_id,
        kind=UsageRecord.Kind.TOOL,
        tier=tier_for_user_id_or_none(user_id=user_id),
        status="complete",
        cost=cost.quantize(COST_PLACES, rounding=ROUND_HALF_UP),
    )


def processing_usage_record(
    *, user: User, deployment: ModelDeployment | None, embedding_tokens: int, moderation_tokens: int
) -> list[UsageRecord]:
    """The ledger rows of a file's processing: its passages' moderation (tokens estimated, free of
    charge, counted towards the quotas, as a /v1/moderations request's) and their embeddings (exact
    tokens at the tier's prompt price on the embedding `deployment`, as a /v1/embeddings request's;
    free when there is none). The caller makes it happen once per file."""
    tier = tier_for_user(user=user)
    embedding = UsageRecord(
        user_id=user.id, kind=UsageRecord.Kind.EMBEDDING, tier=tier, status="complete", prompt_tokens=embedding_tokens
    )
    if deployment is not None:
        prices = tier_prices_for_user_id(user_id=user.id, deployment_id=deployment.id)
        embedding.deployment_id = deployment.id
        embedding.prompt_price_per_1k = prices.prompt_per_1k
        embedding.cost = (Decimal(embedding_tokens) * prices.prompt_per_1k / 1000).quantize(
            COST_PLACES, rounding=ROUND_HALF_UP
        )
    moderation = UsageRecord(
        user_id=user.id, kind=UsageRecord.Kind.MODERATION, tier=tier, status="complete", prompt_tokens=moderation_tokens
    )
    return UsageRecord.objects.bulk_create([moderation, embedding])


class _Ledger:
    """The ledger as accounts reaches it from below (accounts.ledger): the quotas' reading and the
    lighter endpoints' rows."""

    def tokens_since_each(self, *, user: User, since: Sequence[dt.datetime]) -> list[int]:
        return usage_tokens_since_each(user=user, since=since)

    def moderation_charge(self, *, user_id: int, tier_id: int | None, tokens: int) -> None:
        moderation_record(user_id=user_id, tier_id=tier_id, tokens=tokens)

    def embedding_charge(self, *, user_id: int, deployment_id: int, tokens: int) -> None:
        embedding_record(user_id=user_id, deployment_id=deployment_id, tokens=tokens)


LEDGER = _Ledger()
