from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
from functools import cache
from typing import TypeVar

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.models import Session
from django.db.models import Exists, OuterRef, QuerySet, Value
from django.db.models.fields.reverse_related import ManyToManyRel
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from accounts.hooks import deployments_enabled
from accounts.models import ApiKey, SignedInSession, Tier, User, UserSettings
from accounts.protocols import Deployment, ListedDeployment
from chatsite.errors import ClientError

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
    tier = next(iter(Tier.objects.raw(_tier_on_deployment_sql(), (deployment.id, user.id))), None)
    if tier is None:  # no tier of the user's own, and none is the default
        raise _no_default_tier()
    tier.includes_deployment = bool(tier.includes_deployment)  # SQLite answers 0 or 1
    return tier


@cache  # read once the models are all loaded: the list is a relation from the layer above
def _tier_on_deployment_sql() -> str:
    tier, user = Tier._meta.db_table, User._meta.db_table
    # The list is inference's field (ModelDeployment.tiers), read here from the tier's side: its
    # table and columns, not its model.
    relation = Tier._meta.get_field("deployments")
    assert isinstance(relation, ManyToManyRel)  # ModelDeployment.tiers, seen from the tier's side
    models = relation.field
    listed = models.m2m_db_table()
    own = User._meta.get_field("tier").column
    return (
        f'SELECT "{tier}".*, ("{tier}"."all_deployments" OR EXISTS ('
        f'SELECT 1 FROM "{listed}" WHERE "{listed}"."{models.m2m_reverse_name()}" = "{tier}"."id" '
        f'AND "{listed}"."{models.m2m_column_name()}" = %s)) AS "includes_deployment" '
        f'FROM "{tier}" '
        f'WHERE "{tier}"."id" = (SELECT "{user}"."{own}" FROM "{user}" WHERE "{user}"."id" = %s) '
        f'OR "{tier}"."is_default" '
        f'ORDER BY "{tier}"."is_default" LIMIT 1'  # the user's own tier before the default one
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


def user_sessions_list(*, user: User) -> QuerySet[SignedInSession]:
    """Where the user is signed in: their sessions still stored and unexpired, newest first."""
    live = Session.objects.filter(session_key=OuterRef("session_key"), expire_date__gt=timezone.now())
    return SignedInSession.objects.filter(user=user).filter(Exists(live))


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
    }
    return {"account.json": json.dumps(account, indent=2, ensure_ascii=False).encode()}
