from __future__ import annotations

import datetime as dt
import enum
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar, cast

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.models import Session
from django.db.models import Count, Exists, FilteredRelation, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import TruncDate
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from accounts.models import ApiKey, Tier, UsageRecord, User, UserSettings
from accounts.protocols import Deployment
from chatsite.errors import ClientError

ZERO = Decimal("0")
MONEY_PLACES = Decimal("0.000001")


D = TypeVar("D", bound=Deployment)


def _money(value: Decimal | None) -> Decimal:
    # SQLite sums decimals as floats-with-noise; present money at the ledger's own precision.
    return Decimal(value or 0).quantize(MONEY_PLACES)


def tier_default() -> Tier:
    tier = Tier.objects.filter(is_default=True).first()
    if tier is None:
        raise _no_default_tier()
    return tier


def _no_default_tier() -> ClientError:
    return ClientError("The service has no default plan configured.", code="no_tier", status=503)


def tier_for_user(*, user: User) -> Tier:
    """The user's current tier, read fresh (a long-lived socket must see an admin's change at once)."""
    return tier_for_user_or_none(user=user) or tier_default()


def tier_for_user_or_none(*, user: User) -> Tier | None:
    return tier_for_user_id_or_none(user_id=user.id)


def tier_for_user_id_or_none(*, user_id: int) -> Tier | None:
    return Tier.objects.filter(users__id=user_id).first() or Tier.objects.filter(is_default=True).first()


def tier_for_user_on_deployment(*, user: User, deployment: Deployment) -> Tier:
    """The user's tier (else the default one), read fresh, with `includes_deployment`: whether the
    tier may use `deployment` (all models, or the model on its list).

    One statement, where the tier and its model list were two: every send reads both on its way to
    the first token. Written as SQL: the ORM took longer to compile those two reads than PostgreSQL
    took to answer them (docs/performance.md)."""
    tier = next(iter(Tier.objects.raw(_TIER_ON_DEPLOYMENT_SQL, (deployment.id, user.id))), None)
    if tier is None:  # no tier of the user's own, and none is the default
        raise _no_default_tier()
    tier.includes_deployment = bool(tier.includes_deployment)  # SQLite answers 0 or 1
    return tier


def _tier_on_deployment_sql() -> str:
    tier, user = Tier._meta.db_table, User._meta.db_table
    models = Tier._meta.get_field("deployments")
    listed = models.m2m_db_table()
    own = User._meta.get_field("tier").column
    return (
        f'SELECT "{tier}".*, ("{tier}"."all_deployments" OR EXISTS ('
        f'SELECT 1 FROM "{listed}" WHERE "{listed}"."{models.m2m_column_name()}" = "{tier}"."id" '
        f'AND "{listed}"."{models.m2m_reverse_name()}" = %s)) AS "includes_deployment" '
        f'FROM "{tier}" '
        f'WHERE "{tier}"."id" = (SELECT "{user}"."{own}" FROM "{user}" WHERE "{user}"."id" = %s) '
        f'OR "{tier}"."is_default" '
        f'ORDER BY "{tier}"."is_default" LIMIT 1'  # the user's own tier before the default one
    )


_TIER_ON_DEPLOYMENT_SQL = _tier_on_deployment_sql()


def deployments_allowed_for_user(*, user: User, deployments: list[D]) -> list[D]:
    """Those of `deployments` the user's tier may use (for model pickers), in one query."""
    tier = tier_for_user_or_none(user=user)
    if tier is None:
        return []
    if tier.all_deployments:
        return list(deployments)
    allowed = set(tier.deployments.values_list("id", flat=True))
    return [d for d in deployments if d.id in allowed]


def deployments_enabled_for_user(*, user: User) -> list[Any]:
    """The enabled chat deployments the user's tier may use (the settings page's models). Read through
    the tier's own relation, so accounts imports nothing of inference, the layer above it."""
    deployment_model = Tier._meta.get_field("deployments").related_model
    enabled = list(deployment_model._default_manager.filter(is_enabled=True, task="generate"))
    return deployments_allowed_for_user(user=user, deployments=enabled)


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
    then of its price: this runs inside an answer's end, on the way to its `done`.
    """
    own_tier = User.objects.filter(id=user_id).values("tier_id")
    row = (
        Tier.objects.filter(Q(id=Subquery(own_tier)) | Q(is_default=True))
        .annotate(price=FilteredRelation("prices", condition=Q(prices__deployment_id=deployment_id)))
        .order_by("is_default")  # the user's own tier before the default one
        .values_list(
            "id", "price__prompt_price_per_1k", "price__completion_price_per_1k", "price__cached_prompt_price_per_1k"
        )
        .first()
    )
    if row is None:
        return TierPrices(tier_id=None, prompt_per_1k=ZERO, completion_per_1k=ZERO)
    tier_id, prompt, completion, cached = row
    return TierPrices(
        tier_id=tier_id,
        prompt_per_1k=prompt or ZERO,
        completion_per_1k=completion or ZERO,
        cached_per_1k=(prompt or ZERO) if cached is None else cached,
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
    totals = (
        usage_billable(user=user)
        .filter(created_at__gte=since)
        .aggregate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    return (totals["prompt"] or 0) + (totals["completion"] or 0)


def month_bounds(month: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """[first instant of the month, first instant of the next) in UTC."""
    start = dt.datetime(month.year, month.month, 1, tzinfo=dt.UTC)
    end = dt.datetime(month.year + (month.month == 12), month.month % 12 + 1, 1, tzinfo=dt.UTC)
    return start, end


def day_start(now: dt.datetime) -> dt.datetime:
    return now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class UsageSummary:
    start: dt.datetime
    end: dt.datetime
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal
    requests: int
    per_model: list[dict[str, Any]]
    per_day: list[dict[str, Any]]
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
        {**row, "deployment__name": row["deployment__name"] or UsageRecord.Kind.MODERATION, "cost": _money(row["cost"])}
        for row in cast(Iterable[dict[str, Any]], model_rows)
    ]
    day_rows = rows.annotate(day=TruncDate("created_at", tzinfo=dt.UTC)).values("day").annotate(**_TOTALS)
    by_day: dict[dt.date, dict[str, Any]] = {row["day"]: row for row in cast(Iterable[dict[str, Any]], day_rows)}
    per_day = []
    day = start.date()
    while day < end.date():
        row = by_day.get(day, {})
        tokens = (row.get("prompt_tokens") or 0) + (row.get("completion_tokens") or 0)
        per_day.append(
            {"day": day, "tokens": tokens, "cost": _money(row.get("cost")), "requests": row.get("requests", 0)}
        )
        day += dt.timedelta(days=1)
    return UsageSummary(
        start=start,
        end=end,
        prompt_tokens=totals["prompt_tokens"] or 0,
        cached_tokens=totals["cached_tokens"] or 0,
        completion_tokens=totals["completion_tokens"] or 0,
        cost=_money(totals["cost"]),
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


def usage_by_user(*, start: dt.datetime, end: dt.datetime) -> QuerySet[UsageRecord, Any]:
    """One row per user with usage in [start, end): tokens, requests and cost (the admin's overview)."""
    return (
        UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
        .values("user_id", "user__username", "user__tier__name")
        .annotate(**_TOTALS)
        .order_by("-cost", "user__username")
    )


def api_key_list_for_user(*, user: User) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(user_id=user.id)


def api_key_get_by_prefix(*, prefix: str) -> ApiKey | None:
    return ApiKey.objects.select_related("user").filter(prefix=prefix).first()


# --- access: whether an open session may still be used -------------------------------------------

# Session stores whose rows the check below can read in its one statement; with another store a
# sign-out reaches open sockets by its event alone.
DATABASE_SESSION_ENGINES = ("django.contrib.sessions.backends.db", "django.contrib.sessions.backends.cached_db")


class SessionAccess(enum.Enum):
    ALLOWED = "allowed"
    SUSPENDED = "suspended"  # the account is deactivated, or gone
    ENDED = "ended"  # signed out, expired, or signed in with a password that has since changed


def session_access(*, user_id: int, session_key: str, session_auth_hash: str) -> SessionAccess:
    """Whether a session that signed this user in may still be used, read fresh in one statement:
    the account is active, the session is still stored and unexpired, and it carries the hash of
    the account's current password (what `django.contrib.auth.get_user` checks on every request)."""
    stored: Exists | Value
    if settings.SESSION_ENGINE in DATABASE_SESSION_ENGINES:
        stored = Exists(Session.objects.filter(session_key=session_key, expire_date__gt=timezone.now()))
    else:
        stored = Value(True)
    row = (
        User.objects.filter(id=user_id)
        .annotate(session_stored=stored)
        .values_list("is_active", "password", "session_stored")
        .first()
    )
    if row is None or not row[0]:
        return SessionAccess.SUSPENDED
    is_active, password, session_stored = row
    current_hash = User(id=user_id, password=password).get_session_auth_hash()
    if not session_stored or not session_auth_hash or not constant_time_compare(session_auth_hash, current_hash):
        return SessionAccess.ENDED
    return SessionAccess.ALLOWED


def session_key_digest(session_key: str) -> str:
    """How a signed-out session is named to its sockets: the key itself is a credential, and stays
    out of the channel layer."""
    return hashlib.sha256(session_key.encode()).hexdigest()


def user_access_fields(*, user_id: int) -> tuple[bool, str] | None:
    """The stored `is_active` and password hash of a user, to compare a save against; None if no row."""
    return User.objects.filter(id=user_id).values_list("is_active", "password").first()


def user_settings_get(*, user: User) -> UserSettings:
    """The person's settings; every default (unsaved) when they have never changed one."""
    found = UserSettings.objects.filter(user_id=user.id).first()
    return found if found is not None else UserSettings(user_id=user.id)


def user_instructions(*, user_id: int) -> str:
    """The custom instructions a prompt carries for this person ("" when none): one small read."""
    row = UserSettings.objects.filter(user_id=user_id).values("about_me", "answer_style").first()
    return UserSettings(**row).instructions if row else ""


def user_theme(*, user: User | AnonymousUser) -> str:
    """The page theme for a request's user: `light`, `dark` or `system`."""
    if not user.is_authenticated:
        return UserSettings.Theme.SYSTEM
    theme = UserSettings.objects.filter(user_id=user.id).values_list("theme", flat=True).first()
    return theme or UserSettings.Theme.SYSTEM


# Lines other apps add to the usage page (documents: the storage its files take), each a callable
# taking the user and returning (label, value) pairs; registered in the app's `ready()`, since
# accounts sits below them and imports none of them.
USAGE_FIGURES: list[Any] = []


def usage_figures(*, user: Any) -> list[tuple[str, str]]:
    return [figure for provider in USAGE_FIGURES for figure in provider(user)]
