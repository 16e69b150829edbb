"""Reads of the ledger: a tier's prices, what counts towards the quotas, and the usage pages' figures."""

from __future__ import annotations

import csv
import datetime as dt
import io
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import TypedDict, cast

from django.db.models import BooleanField, Count, ExpressionWrapper, F, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from accounts.models import Tier, User
from accounts.selectors import month_bounds, own_tier_else_default_sql
from billing.models import TierModelPrice, UsageRecord
from billing.money import money_format, money_json
from chatsite.parsers import JsonObject

ZERO = Decimal("0")
MONEY_PLACES = Decimal("0.000001")


def ledger_money(value: Decimal | float | None) -> Decimal:
    """An amount read from the ledger (a sum: NULL over no rows) at the ledger's own precision:
    SQLite sums decimals as floats-with-noise."""
    return Decimal(value or 0).quantize(MONEY_PLACES)


@dataclass(frozen=True)
class TierPrices:
    """What a user's tier pays per 1,000 tokens on one deployment; `tier_id` None: no tier exists."""

    tier_id: int | None
    prompt_per_1k: Decimal
    completion_per_1k: Decimal
    # Prompt tokens the engine's prefix cache served; the prompt price where the tier sets none.
    cached_per_1k: Decimal = ZERO


def tier_prices_for_user_id(*, user_id: int, deployment_id: int) -> TierPrices:
    """The user's tier (else the default one) and its prices on the deployment, in one statement.

    A deployment with no price row is free for the tier. One statement, not a read of the tier and
    then of its price: this runs inside every answer's end, on the way to its `done`. Written as SQL:
    the ORM spent more CPU compiling it than PostgreSQL spent answering (docs/performance-relay.md).
    """
    price = next(iter(TierModelPrice.objects.raw(_tier_prices_sql(), (deployment_id, user_id))), None)
    if price is None:
        return TierPrices(tier_id=None, prompt_per_1k=ZERO, completion_per_1k=ZERO)
    prompt, completion, cached = (
        price.prompt_price_per_1k,
        price.completion_price_per_1k,
        price.cached_prompt_price_per_1k,
    )
    return TierPrices(
        tier_id=price.tier_id,
        prompt_per_1k=prompt or ZERO,
        completion_per_1k=completion or ZERO,
        cached_per_1k=(prompt or ZERO) if cached is None else cached,
    )


@cache  # read once the models are all loaded
def _tier_prices_sql() -> str:
    """The tier's id and its price row on %s (NULLs: none), for the user %s's tier or the default one.
    Read as price rows, so that each price comes back a Decimal on every database."""
    tier, price = Tier._meta.db_table, TierModelPrice._meta.db_table
    return (
        f'SELECT p."id", t."id" AS "tier_id", p."prompt_price_per_1k", p."completion_price_per_1k", '
        f'p."cached_prompt_price_per_1k" FROM "{tier}" t '
        f'LEFT JOIN "{price}" p ON p."tier_id" = t."id" AND p."deployment_id" = %s '
        f"{own_tier_else_default_sql('t')}"
    )


def usage_billable(*, user: User) -> QuerySet[UsageRecord]:
    """Ledger rows that count towards quotas: failed generations are neither charged nor counted, and
    neither is what the house pays for (a conversation's summary, an answer from the response cache)."""
    return (
        UsageRecord.objects.filter(user_id=user.id)
        .exclude(status="failed")
        .exclude(kind__in=[UsageRecord.Kind.SUMMARY, UsageRecord.Kind.CACHED])
    )


def usage_tokens_since(*, user: User, since: dt.datetime) -> int:
    return usage_tokens_since_each(user=user, since=[since])[0]


def usage_tokens_since_each(*, user: User, since: Sequence[dt.datetime]) -> list[int]:
    """`usage_tokens_since` for each of `since` (a day's and a month's quota), in one statement."""
    if not since:
        return []
    tokens = F("prompt_tokens") + F("completion_tokens")
    sums = {f"since_{i}": Sum(tokens, filter=Q(created_at__gte=start)) for i, start in enumerate(since)}
    totals = usage_billable(user=user).filter(created_at__gte=min(since)).aggregate(**sums)
    return [totals[f"since_{i}"] or 0 for i in range(len(since))]


@dataclass(frozen=True)
class UsageSummary:
    start: dt.datetime
    end: dt.datetime
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal
    requests: int
    per_model: list[JsonObject]
    per_day: list[JsonObject]
    # Of the prompt tokens, those the engine's prefix cache served (charged at the cached price).
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


_TOTALS = {
    "prompt_tokens": Sum("prompt_tokens"),
    "cached_tokens": Sum("cached_tokens"),
    "completion_tokens": Sum("completion_tokens"),
    "cost": Sum("cost"),
    "requests": Count("id"),
}


def usage_summary(*, user: User, month: dt.date) -> UsageSummary:
    """Tokens and cost for one calendar month: in total, per model and per day (every day, zeros included)."""
    start, end = month_bounds(month)
    rows = UsageRecord.objects.filter(user_id=user.id, created_at__gte=start, created_at__lt=end)
    totals = rows.aggregate(**_TOTALS)
    # The rows' totals are annotations the type checker cannot name (`_TOTALS`): plain dicts here.
    model_rows = rows.values("deployment__name").annotate(**_TOTALS).order_by("deployment__name")
    per_model = [
        # A row with no model is a moderation request's (the only kind without one).
        {
            **row,
            "deployment__name": row["deployment__name"] or UsageRecord.Kind.MODERATION,
            "cost": ledger_money(row["cost"]),
        }
        for row in cast(Iterable[JsonObject], model_rows)
    ]
    day_rows = rows.annotate(day=TruncDate("created_at", tzinfo=dt.UTC)).values("day").annotate(**_TOTALS)
    by_day: dict[dt.date, JsonObject] = {row["day"]: row for row in cast(Iterable[JsonObject], day_rows)}
    per_day = []
    day = start.date()
    while day < end.date():
        row = by_day.get(day, {})
        tokens = (row.get("prompt_tokens") or 0) + (row.get("completion_tokens") or 0)
        per_day.append(
            {"day": day, "tokens": tokens, "cost": ledger_money(row.get("cost")), "requests": row.get("requests", 0)}
        )
        day += dt.timedelta(days=1)
    return UsageSummary(
        start=start,
        end=end,
        prompt_tokens=totals["prompt_tokens"] or 0,
        cached_tokens=totals["cached_tokens"] or 0,
        completion_tokens=totals["completion_tokens"] or 0,
        cost=ledger_money(totals["cost"]),
        requests=totals["requests"],
        per_model=per_model,
        per_day=per_day,
    )


def usage_statement_rows(*, user: User, month: dt.date) -> QuerySet[UsageRecord]:
    start, end = month_bounds(month)
    return (
        UsageRecord.objects.filter(user_id=user.id, created_at__gte=start, created_at__lt=end)
        .select_related("deployment", "tier")
        .order_by("created_at", "id")
    )


class UserUsageRow(TypedDict):
    """A row of `usage_by_user`: who, and (annotations the type checker cannot see) the totals of `_TOTALS`."""

    user_id: int  # None for a deleted account's records (the type checker's plugin cannot see it)
    former_account: int | None  # a deleted account's number
    user__username: str
    user__tier__name: str


def usage_by_user(*, start: dt.datetime, end: dt.datetime) -> QuerySet[UsageRecord, UserUsageRow]:
    """One row per user with usage in [start, end): tokens, requests and cost (the admin's overview)."""
    return (
        UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
        .values("user_id", "former_account", "user__username", "user__tier__name")
        .annotate(**_TOTALS)
        .order_by("-cost", "user__username")
    )


# Lines other apps add to the usage page (documents: the storage its files take), each a callable
# taking the user and returning (label, value) pairs; registered in the app's `ready()`, since
# billing sits below them and imports none of them.
USAGE_FIGURES: list[Callable[[User], list[tuple[str, str]]]] = []


def usage_figures(*, user: User) -> list[tuple[str, str]]:
    return [figure for provider in USAGE_FIGURES for figure in provider(user)]


# --- what answers cost, as the chat page shows them ---------------------------------------------


@dataclass(frozen=True)
class GenerationUsage:
    """One generation's ledger row as its owner sees it beside the answer. `priced`: the plan charged
    for its tokens (a price above zero); otherwise the page shows tokens and no cost."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: Decimal
    priced: bool

    @property
    def cost_text(self) -> str:
        return money_format(self.cost) if self.priced else ""


@dataclass(frozen=True)
class UsageTotal:
    """Tokens and cost of several generations (a conversation's answers)."""

    tokens: int
    cost: Decimal
    priced: bool

    @property
    def text(self) -> str:
        tokens = f"{self.tokens:,} token{'' if self.tokens == 1 else 's'}"
        return f"{tokens} · {money_format(self.cost)}" if self.priced else tokens

    def as_json(self) -> JsonObject:
        return {"tokens": self.tokens, "cost": money_json(self.cost) if self.priced else None, "text": self.text}


# A ledger row is priced when its plan set any of these prices (a free plan's rows cost nothing).
PRICE_FIELDS = ("prompt_price_per_1k", "completion_price_per_1k", "cached_price_per_1k")
_PRICED = Q(*[(f"{name}__gt", 0) for name in PRICE_FIELDS], _connector=Q.OR)


def usage_for_generations(*, user_id: int, generation_ids: Collection[uuid.UUID | str]) -> dict[str, GenerationUsage]:
    """The ledger rows of the user's own generations among `generation_ids`,
    by generation id as text. Another user's generation is simply absent."""
    rows = (
        UsageRecord.objects.filter(user_id=user_id, generation_id__in=generation_ids)
        .annotate(priced=ExpressionWrapper(_PRICED, output_field=BooleanField()))
        .values_list("generation_id", "prompt_tokens", "cached_tokens", "completion_tokens", "cost", "priced")
    )
    return {
        str(generation_id): GenerationUsage(prompt, cached, completion, ledger_money(cost), bool(priced))
        for generation_id, prompt, cached, completion, cost, priced in rows
    }


def usage_total_for_generations(*, user_id: int, generation_ids: Collection[uuid.UUID | str]) -> UsageTotal:
    """What the user's own generations among `generation_ids` used and cost, in one statement."""
    totals = UsageRecord.objects.filter(user_id=user_id, generation_id__in=generation_ids).aggregate(
        prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"),
        cost=Sum("cost"),
        priced=Count("id", filter=_PRICED),
    )
    return UsageTotal(
        tokens=(totals["prompt"] or 0) + (totals["completion"] or 0),
        cost=ledger_money(totals["cost"]),
        priced=bool(totals["priced"]),
    )


def usage_export_files(*, user: User) -> dict[str, bytes]:
    """billing's part of a person's data archive: every usage record of theirs, as usage.csv."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["created_at", "kind", "model", "status", "prompt_tokens", "cached_tokens", "completion_tokens", "cost"]
    )
    records = UsageRecord.objects.filter(user=user).select_related("deployment").order_by("created_at", "id")
    for record in records:
        writer.writerow(
            [
                record.created_at.isoformat(),
                record.kind,
                record.deployment.name if record.deployment else "",
                record.status,
                record.prompt_tokens,
                record.cached_tokens,
                record.completion_tokens,
                record.cost,
            ]
        )
    return {"usage.csv": out.getvalue().encode()}
