from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from django.core.cache import cache
from django.db.models import Q, QuerySet

from accounts.models import User
from accounts.selectors import tier_for_user_id_or_none
from moderation.defaults import DEFAULT_RULES
from moderation.models import Flag, ModerationPolicy
from moderation.subjects import FlagContext, flag_subjects


@dataclass(frozen=True)
class PolicySnapshot:
    """A policy read once, free of the ORM, so the streaming loop can consult it without queries."""

    policy_id: int | None
    name: str
    rules: dict[str, tuple[float, str]]
    moderate_input: bool = True
    moderate_output: bool = True


def policy_built_in() -> PolicySnapshot:
    """The defaults that apply when no active policy does (moderation/defaults.py)."""
    return PolicySnapshot(policy_id=None, name="built-in defaults", rules=dict(DEFAULT_RULES))


# Policies are read for every message and change rarely, so each tier's snapshot is kept in the shared
# cache (Redis in the production topology) under a version that any change to a policy or a rule moves
# (moderation/receivers.py): no process reads a snapshot older than the change. Each process also keeps
# the snapshots it has read, under the same keys, so a message costs one cache read (the version), not
# two. The timeout only bounds what a change that sends no signals (a bulk update in a shell) leaves
# behind: twice over, once in the shared cache and once in a process.
POLICY_VERSION_KEY = "moderation:policy:version"
POLICY_CACHE_TIMEOUT_S = 60
_snapshots: dict[str, tuple[float, PolicySnapshot]] = {}  # key -> (when read, snapshot)


def policy_for_user(*, user: User) -> PolicySnapshot:
    """The active policy for the user's tier, else the active global one, else the built-in defaults.

    The user's tier is read fresh (an admin's change applies to the next message); the policy comes
    from the cache.
    """
    return policy_for_user_id(user_id=user.id)


def policy_for_user_id(*, user_id: int) -> PolicySnapshot:
    """`policy_for_user` by the user's id: for a caller holding a row that refers to the user."""
    tier = tier_for_user_id_or_none(user_id=user_id)
    return policy_for_tier(tier_id=tier.id if tier is not None else None)


def policy_for_tier(*, tier_id: int | None) -> PolicySnapshot:
    version = cache.get(POLICY_VERSION_KEY)
    if version is None:
        version = policy_cache_invalidate()
    key = f"moderation:policy:{version}:{tier_id or 'none'}"
    now = time.monotonic()
    held = _snapshots.get(key)
    if held is not None and now - held[0] < POLICY_CACHE_TIMEOUT_S:
        return held[1]
    snapshot = cache.get(key)
    if snapshot is None:
        # Read after the version: a change committed since is either in this read or moves the version.
        snapshot = _policy_for_tier_from_db(tier_id=tier_id)
        cache.set(key, snapshot, timeout=POLICY_CACHE_TIMEOUT_S)
    if len(_snapshots) >= 256:  # older versions' snapshots, never read again
        _snapshots.clear()
    _snapshots[key] = (now, snapshot)
    return snapshot


def policy_cache_invalidate() -> str:
    """Move the policies' cache version: every process reads the policies afresh. Returns it."""
    version = uuid.uuid4().hex
    cache.set(POLICY_VERSION_KEY, version, timeout=None)
    return version


def _policy_for_tier_from_db(*, tier_id: int | None) -> PolicySnapshot:
    applies = Q(tier__isnull=True) if tier_id is None else Q(tier__isnull=True) | Q(tier_id=tier_id)
    candidates = ModerationPolicy.objects.filter(applies, is_active=True).prefetch_related("rules")
    chosen = None
    for policy in candidates:
        if chosen is None or policy.tier_id is not None:
            chosen = policy
    if chosen is None:
        return policy_built_in()
    return PolicySnapshot(
        policy_id=chosen.id,
        name=chosen.name,
        rules={rule.category: (rule.threshold, rule.action) for rule in chosen.rules.all()},
        moderate_input=chosen.moderate_input,
        moderate_output=chosen.moderate_output,
    )


def flag_list_for_review() -> QuerySet[Flag]:
    return Flag.objects.select_related("user", "reviewer", "policy")


def flag_context(*, flag: Flag, before: int = 6) -> FlagContext:
    """The flagged message and the turns that led to it, oldest first (conversations reads them:
    moderation.subjects)."""
    return flag_subjects().flag_context(flag_id=flag.id, before=before)
