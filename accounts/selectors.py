from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
import math
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.models import Session
from django.db import connection
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.fields.reverse_related import ManyToManyRel
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from accounts.hooks import deployments_enabled, quota_tokens_reserved
from accounts.ledger import ledger
from accounts.models import (
    ApiKey,
    ExternalIdentity,
    Passkey,
    SignedInSession,
    Tier,
    TotpDevice,
    User,
    UserSettings,
)
from accounts.protocols import Deployment, ListedDeployment
from chatsite.errors import ClientError
from chatsite.queries import sql_now

D = TypeVar("D", bound=Deployment)


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


@dataclass(frozen=True)
class ConversationSettingsLimits:
    """What a conversation's own settings may hold on the user's plan."""

    plan: str
    system_prompt_chars: int
    temperature_min: float
    temperature_max: float


def conversation_settings_limits(*, user: User) -> ConversationSettingsLimits:
    """The plan's limits on a conversation's system prompt and temperature (`Tier`)."""
    tier = tier_for_user(user=user)
    return ConversationSettingsLimits(
        plan=str(tier),
        system_prompt_chars=tier.conversation_prompt_chars,
        temperature_min=Tier.TEMPERATURE_MIN,
        temperature_max=Tier.TEMPERATURE_MAX,
    )


def tier_for_user_or_none(*, user: User) -> Tier | None:
    return tier_for_user_id_or_none(user_id=user.id)


def tier_for_user_id_or_none(*, user_id: int) -> Tier | None:
    """The user's tier, else the default one, read fresh; None when neither is found.

    One statement, written as SQL: every send, every answer's `done` and every finished generation
    read it, and the ORM took longer to compile the user's tier and the default (two reads when the
    user has none) than PostgreSQL took to answer them (docs/performance-relay.md)."""
    return next(iter(Tier.objects.raw(_tier_of_user_sql(), (user_id,))), None)


@cache  # read once the models are all loaded
def _tier_of_user_sql() -> str:
    tier = Tier._meta.db_table
    chosen = own_tier_else_default_sql(f'"{tier}"')
    return f'SELECT "{tier}".* FROM "{tier}" {chosen}'


def own_tier_else_default_sql(tier: str) -> str:
    """The end of a statement that reads tiers as `tier` (the quoted table, or its alias): the user
    %s's own tier, else the default one, as its one row. Every read of "the user's tier" in SQL ends
    with it, so the rule is written once."""
    user = User._meta.db_table
    own = User._meta.get_field("tier").column
    return (
        f'WHERE {tier}."id" = (SELECT u."{own}" FROM "{user}" u WHERE u."id" = %s) OR {tier}."is_default" '
        f'ORDER BY {tier}."is_default" LIMIT 1'  # the user's own tier before the default one
    )


def tier_for_user_on_deployment(*, user: User, deployment: Deployment) -> Tier:
    """The user's tier (else the default one), read fresh, with `includes_deployment`: whether the
    tier may use `deployment` (all models, or the model on its list).

    One statement, where the tier and its model list were two: every send reads both on its way to
    the first token. Written as SQL: the ORM took longer to compile those two reads than PostgreSQL
    took to answer them (docs/performance.md)."""
    tier = next(iter(Tier.objects.raw(_tier_on_deployment_sql(), (deployment.id, user.id))), None)
    if tier is None:  # no tier of the user's own, and none is the default
        raise _no_default_tier()
    tier.includes_deployment = bool(tier.includes_deployment)  # SQLite answers 0 or 1
    return tier


@cache  # read once the models are all loaded: the list is a relation from the layer above
def _tier_on_deployment_sql() -> str:
    tier = Tier._meta.db_table
    # The list is inference's field (ModelDeployment.tiers), read here from the tier's side: its
    # table and columns, not its model.
    relation = Tier._meta.get_field("deployments")
    assert isinstance(relation, ManyToManyRel)  # ModelDeployment.tiers, seen from the tier's side
    models = relation.field
    listed = models.m2m_db_table()
    chosen = own_tier_else_default_sql(f'"{tier}"')
    return (
        f'SELECT "{tier}".*, ("{tier}"."all_deployments" OR EXISTS ('
        f'SELECT 1 FROM "{listed}" WHERE "{listed}"."{models.m2m_reverse_name()}" = "{tier}"."id" '
        f'AND "{listed}"."{models.m2m_column_name()}" = %s)) AS "includes_deployment" '
        f'FROM "{tier}" {chosen}'
    )


def deployments_allowed_for_user(*, user: User, deployments: list[D]) -> list[D]:
    """Those of `deployments` the user's tier may use (for model pickers), in one query."""
    tier = tier_for_user_or_none(user=user)
    if tier is None:
        return []
    if tier.all_deployments:
        return list(deployments)
    allowed = set(tier.deployments.values_list("id", flat=True))
    return [d for d in deployments if d.id in allowed]


def deployments_enabled_for_user(*, user: User) -> list[ListedDeployment]:
    """The enabled chat deployments the user's tier may use (the settings page's models), as
    inference lists them through the hook it registers (accounts imports nothing of the layer above)."""
    return deployments_allowed_for_user(user=user, deployments=deployments_enabled())


def month_bounds(month: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """[first instant of the month, first instant of the next) in UTC."""
    start = dt.datetime(month.year, month.month, 1, tzinfo=dt.UTC)
    end = dt.datetime(month.year + (month.month == 12), month.month % 12 + 1, 1, tzinfo=dt.UTC)
    return start, end


def day_start(now: dt.datetime) -> dt.datetime:
    return now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


# --- quotas: what is left of the plan this period ------------------------------------------------

# The share of a quota used from which the pages warn that it is running out.
QUOTA_WARNING_AT = 0.8


@dataclass(frozen=True)
class QuotaPeriod:
    """One of a tier's token quotas over its UTC calendar period: [since, resets_at)."""

    name: str  # "day" or "month"
    limit: int
    since: dt.datetime
    resets_at: dt.datetime

    @property
    def owned(self) -> str:
        """How a sentence names the period's tokens: "today's", "this month's"."""
        return "today's" if self.name == "day" else "this month's"


def quota_periods(*, tier: Tier, now: dt.datetime) -> list[QuotaPeriod]:
    """The tier's token quotas in force at `now`: a day's resets at the next midnight UTC, a month's
    on the first of the next month (UTC). None when the tier has no quota."""
    periods = []
    if tier.tokens_per_day:
        start = day_start(now)
        periods.append(QuotaPeriod("day", tier.tokens_per_day, start, start + dt.timedelta(days=1)))
    if tier.tokens_per_month:
        start, end = month_bounds(now.astimezone(dt.UTC).date())
        periods.append(QuotaPeriod("month", tier.tokens_per_month, start, end))
    return periods


def time_until_words(*, now: dt.datetime, then: dt.datetime) -> str:
    """Words like "in 12 minutes", "in 5 hours", "in 3 days": rounded up below two days (a reset "in 0 hours"
    would mislead), down from there."""
    seconds = max(0.0, (then - now).total_seconds())
    if seconds < 3600:
        count, unit = max(1, math.ceil(seconds / 60)), "minute"
    elif seconds < 48 * 3600:
        count, unit = math.ceil(seconds / 3600), "hour"
    else:
        count, unit = int(seconds // 86400), "day"
    return f"in {count} {unit}{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class QuotaLevel:
    """How much of one quota period is used, as the sidebar and the usage page show it. `used`
    counts what the ledger holds and what unfinished answers may still use, as the quota check
    does, so the page says "run out" exactly when a send would be refused."""

    period: QuotaPeriod
    used: int
    now: dt.datetime

    @property
    def limit(self) -> int:
        return self.period.limit

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)

    @property
    def shown_used(self) -> int:
        """`used`, at most the limit (the bar's value)."""
        return min(self.used, self.limit)

    @property
    def state(self) -> str:
        if self.left <= 0:
            return "exhausted"
        return "warning" if self.used >= self.limit * QUOTA_WARNING_AT else "ok"

    @property
    def resets_in(self) -> str:
        return time_until_words(now=self.now, then=self.period.resets_at)

    @property
    def text(self) -> str:
        if self.state == "exhausted":
            return (
                f"You have used all {self.limit:,} of {self.period.owned} tokens. "
                f"Messages are refused until the quota resets {self.resets_in} "
                f"({self.period.resets_at:%Y-%m-%d %H:%M} UTC)."
            )
        when = "today" if self.period.name == "day" else "this month"
        return f"{self.left:,} of {self.limit:,} tokens left {when} · resets {self.resets_in}"


@dataclass(frozen=True)
class QuotaStatus:
    """What is left of a user's plan: a level per quota the tier sets (none: unlimited)."""

    levels: tuple[QuotaLevel, ...]

    @property
    def binding(self) -> QuotaLevel | None:
        """The level that refuses first: the least left, then the sooner reset."""
        return min(self.levels, key=lambda level: (level.left, level.period.resets_at), default=None)

    @property
    def state(self) -> str:
        """One of "unlimited", "ok", "warning" (QUOTA_WARNING_AT used) or "exhausted" (sends refused)."""
        binding = self.binding
        if binding is None:
            return "unlimited"
        # A quota nearly used warns even while another one leaves less.
        if binding.state == "ok" and any(level.state != "ok" for level in self.levels):
            return "warning"
        return binding.state

    @property
    def text(self) -> str:
        binding = self.binding
        return "Unlimited tokens on your plan" if binding is None else binding.text

    def as_json(self) -> dict[str, object]:
        """The sidebar's figures, as the chat socket's `generation.done` carries them."""
        binding = self.binding
        return {
            "state": self.state,
            "text": self.text,
            "limit": binding.limit if binding else None,
            "used": binding.shown_used if binding else None,
        }


def quota_status_for_user(*, user: User, now: dt.datetime | None = None) -> QuotaStatus:
    """What is left of each of the user's token quotas this period, and when each resets."""
    now = now or timezone.now()
    periods = quota_periods(tier=tier_for_user(user=user), now=now)
    if not periods:
        return QuotaStatus(levels=())
    reserved = quota_tokens_reserved(user=user)
    used = ledger().tokens_since_each(user=user, since=[period.since for period in periods])
    return QuotaStatus(
        levels=tuple(
            QuotaLevel(period, used=tokens + reserved, now=now) for period, tokens in zip(periods, used, strict=True)
        )
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
    the account's current password (what `django.contrib.auth.get_user` checks on every request).

    Written as SQL: a socket's frames read it (at most every few tenths of a second), and the ORM
    spent more CPU compiling it than PostgreSQL spent answering (docs/performance-relay.md)."""
    with connection.cursor() as cursor:
        if settings.SESSION_ENGINE in DATABASE_SESSION_ENGINES:
            cursor.execute(_session_access_sql(), (session_key, sql_now(), user_id))
        else:  # a sign-out reaches open sockets by its event alone
            cursor.execute(_account_access_sql(), (user_id,))
        row = cursor.fetchone()
    if row is None or not row[0]:
        return SessionAccess.SUSPENDED
    is_active, password, session_stored = row
    current_hash = User(id=user_id, password=password).get_session_auth_hash()
    if not session_stored or not session_auth_hash or not constant_time_compare(session_auth_hash, current_hash):
        return SessionAccess.ENDED
    return SessionAccess.ALLOWED


@cache  # read once the models are all loaded
def _session_access_sql() -> str:
    """The account's `is_active` and password hash, and whether the session %s is stored and
    unexpired at %s, for the user %s; no row when the account is gone."""
    user, session = User._meta.db_table, Session._meta.db_table
    return (
        f'SELECT u."is_active", u."password", EXISTS (SELECT 1 FROM "{session}" s '
        f'WHERE s."session_key" = %s AND s."expire_date" > %s) FROM "{user}" u WHERE u."id" = %s'
    )


@cache
def _account_access_sql() -> str:
    """As `_session_access_sql`, for a session store the database does not hold: stored, always."""
    return f'SELECT u."is_active", u."password", 1 FROM "{User._meta.db_table}" u WHERE u."id" = %s'


def user_sessions_list(*, user: User) -> QuerySet[SignedInSession]:
    """Where the user is signed in: their sessions still stored and unexpired, newest first."""
    live = Session.objects.filter(session_key=OuterRef("session_key"), expire_date__gt=timezone.now())
    return SignedInSession.objects.filter(user=user).filter(Exists(live))


def second_factor_enabled(*, user: User) -> bool:
    """An authenticator app or a passkey: either makes a sign-in's first step wait for it."""
    return totp_enabled(user=user) or Passkey.objects.filter(user=user).exists()


def totp_enabled(*, user: User) -> bool:
    return TotpDevice.objects.filter(user=user).exists()


def second_factor_required(*, user: User) -> bool:
    """Whether the operator requires this user to sign in with a second factor (TWO_FACTOR_REQUIRED)."""
    required = settings.TWO_FACTOR_REQUIRED
    return required == "everyone" or (required == "staff" and (user.is_staff or user.is_superuser))


def password_sign_in_allowed(*, user: User) -> bool:
    """Whether the user may sign in with a password: always, unless the operator turned passwords off
    (PASSWORD_SIGN_IN=off); then only the accounts PASSWORD_SIGN_IN_ALLOWED names ("superusers":
    every superuser), the way in when the identity provider is down."""
    if settings.PASSWORD_SIGN_IN == "on":
        return True
    allowed = settings.PASSWORD_SIGN_IN_ALLOWED
    return user.get_username() in allowed or ("superusers" in allowed and user.is_superuser)


def linked_identities_list(*, user: User) -> QuerySet[ExternalIdentity]:
    return ExternalIdentity.objects.filter(user=user).order_by("created_at")


def passkeys_list(*, user: User) -> QuerySet[Passkey]:
    return Passkey.objects.filter(user=user)


def recovery_codes_left(*, user: User) -> int:
    return user.recovery_codes.filter(used_at__isnull=True).count()


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


# --- what the service holds about a person ---------------------------------------------------------


def _when(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def user_export_files(*, user: User) -> dict[str, bytes]:
    """accounts' part of a person's data archive: their account, settings, API keys (never a
    secret: only a hash is stored) and where they are signed in."""
    chat_settings = user_settings_get(user=user)
    tier = tier_for_user_or_none(user=user)
    account = {
        "username": user.username,
        "email": user.email,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "date_joined": _when(user.date_joined),
        "last_login": _when(user.last_login),
        "plan": tier.name if tier else None,
        "settings": {
            "about_me": chat_settings.about_me,
            "answer_style": chat_settings.answer_style,
            "default_model": chat_settings.default_model,
            "theme": chat_settings.theme,
        },
        "api_keys": [
            {
                "name": key.name,
                "prefix": key.prefix,
                "scopes": key.scopes,
                "created_at": _when(key.created_at),
                "expires_at": _when(key.expires_at),
                "revoked_at": _when(key.revoked_at),
                "last_used_at": _when(key.last_used_at),
            }
            for key in ApiKey.objects.filter(user=user).order_by("created_at")
        ],
        "sessions": [
            {"signed_in_at": _when(s.created_at), "user_agent": s.user_agent, "address": s.address}
            for s in user_sessions_list(user=user)
        ],
        "linked_sign_ins": [
            {
                "provider": i.provider,
                "email": i.email,
                "linked_at": _when(i.created_at),
                "last_used_at": _when(i.last_used_at),
            }
            for i in ExternalIdentity.objects.filter(user=user).order_by("created_at")
        ],
        "passkeys": [
            {"name": p.name, "created_at": _when(p.created_at), "last_used_at": _when(p.last_used_at)}
            for p in Passkey.objects.filter(user=user)
        ],
    }
    return {"account.json": json.dumps(account, indent=2, ensure_ascii=False).encode()}
