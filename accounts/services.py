from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass

import pyotp
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.sessions.models import Session
from django.core import signing
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from accounts.hooks import quota_tokens_reserved
from accounts.ledger import ledger
from accounts.models import ApiKey, RecoveryCode, SignedInSession, Tier, TotpDevice, User, UserSettings
from accounts.protocols import Deployment
from accounts.ratelimit import Charge, buckets_consume, buckets_peek, buckets_refund, buckets_reset
from accounts.selectors import (
    api_key_get_by_prefix,
    quota_periods,
    session_key_digest,
    tier_for_user,
    tier_for_user_on_deployment,
)
from accounts.signals import user_deactivated
from chatsite.errors import ClientError
from chatsite.parsers import JsonObject

KEY_PREFIX_BYTES = 4  # 8 hex characters: enough to tell a user's keys apart, never enough to guess one
KEY_SECRET_BYTES = 32
KEY_TOUCH_INTERVAL = dt.timedelta(minutes=1)
MAX_KEY_NAME = 100
MAX_KEY_CAP = 2**31 - 1  # what the columns hold
MINUTE_S = 60


@transaction.atomic
def user_create(*, username: str, password: str, email: str = "") -> User:
    user = User(username=username, email=email, tier=Tier.objects.filter(is_default=True).first())
    user.set_password(password)
    user.full_clean(exclude=["password"])
    user.save()
    return user


def user_set_tier(*, user: User, tier: Tier) -> User:
    user.tier = tier
    user.save(update_fields=["tier"])
    return user


# --- access: suspension, deactivation, sign-out, a new password ---------------------------------


def user_group(user_id: int) -> str:
    """The channel-layer group each of the user's open chat sockets joins, in whichever process."""
    return f"user.{user_id}"


@transaction.atomic
def user_deactivate(*, user_id: int) -> bool:
    """Deactivate an account (a suspension): it can no longer sign in, its open sockets close, and
    what it has queued or running stops. False when it was inactive already."""
    deactivated = User.objects.filter(id=user_id, is_active=True).update(is_active=False)
    if deactivated:
        user_access_changed(user_id=user_id, deactivated=True)
    return bool(deactivated)


def user_delete(*, user: User) -> None:
    """Delete an account for good, and everything the service holds about its person: their
    conversations, files and their passages, keys, settings, sessions, feedback and flags go with
    the row (each points to the user with CASCADE). What is queued or running stops first, while it
    can still be found; open sockets close once this commits. The ledger keeps its records, which
    hold no content, numbered by the old account's id (billing)."""
    user_id = user.pk
    with transaction.atomic():
        user_deactivated.send(sender=User, user_id=user_id)
        signed_in = SignedInSession.objects.filter(user_id=user_id).values_list("session_key", flat=True)
        Session.objects.filter(session_key__in=list(signed_in)).delete()
        user.delete()
        user_access_changed(user_id=user_id)


# --- where a user is signed in -------------------------------------------------------------------

USER_AGENT_MAX_CHARS = 300


def user_session_record(*, user: User, session_key: str, user_agent: str, address: str) -> None:
    """Note a sign-in's session for the user's list of them, clearing the rows of sessions ended since."""
    live = Session.objects.filter(session_key=OuterRef("session_key"), expire_date__gt=timezone.now())
    SignedInSession.objects.filter(user=user).exclude(Exists(live)).delete()
    SignedInSession.objects.update_or_create(
        session_key=session_key,
        defaults={"user": user, "user_agent": user_agent[:USER_AGENT_MAX_CHARS], "address": address[:45]},
    )


def user_sessions_end_others(*, user: User, keep_session_key: str) -> int:
    """Sign the user out of every session but `keep_session_key` (the one asking); their open chat
    sockets close. Returns how many sessions ended."""
    with transaction.atomic():
        others = SignedInSession.objects.filter(user=user).exclude(session_key=keep_session_key)
        keys = list(others.values_list("session_key", flat=True))
        ended, _ = Session.objects.filter(session_key__in=keys).delete()
        others.delete()
        if keys:
            user_access_changed(user_id=user.pk)  # each socket reads its session again: gone ones close
    return ended


def user_access_after_save(*, user: User, was_active: bool, old_password: str) -> None:
    """After a save of an existing user (the admin's form, a password change, the shell): a
    deactivation or a new password ends what the account's sessions had opened."""
    deactivated = was_active and not user.is_active
    if deactivated or user.password != old_password:
        user_access_changed(user_id=user.pk, deactivated=deactivated)


def user_access_changed(*, user_id: int, deactivated: bool = False, session_key: str | None = None) -> None:
    """Once the caller's transaction commits, tell the user's open chat sockets that what let them in
    may have ended.

    With `session_key` (a sign-out) the sockets of that session close. Without it each socket reads
    its account and session again and closes if it may no longer be used: after a deactivation
    every one, after a new password those whose session still carries the old one's hash.
    `deactivated`: `user_deactivated` is sent too, so what the account has running stops. A lost
    event leaves each socket's own check on its next frame (conversations/consumers.py)."""
    event: JsonObject = {"type": "user.access", "session": session_key_digest(session_key) if session_key else None}
    transaction.on_commit(lambda: user_sockets_tell(user_id=user_id, event=event), robust=True)
    if deactivated:
        transaction.on_commit(lambda: user_deactivated.send(sender=User, user_id=user_id), robust=True)


def user_sockets_tell(*, user_id: int, event: JsonObject) -> None:
    """Send `event` to every open chat socket of the user's, in whichever process."""
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(user_group(user_id), event)


# --- API keys ------------------------------------------------------------------------------------


def _hash_secret(secret: str) -> str:
    # The secret is 256 random bits: a plain SHA-256 cannot be brute-forced, and a fast hash keeps
    # authenticating a request cheap. (Passwords need a slow hash; these keys do not.)
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class CreatedApiKey:
    api_key: ApiKey
    key: str  # the full key: shown once, never stored


def api_key_create(
    *,
    user: User,
    name: str,
    scopes: list[str],
    expires_at: dt.datetime | None = None,
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
) -> CreatedApiKey:
    """A new key for `user`, optionally capped below their plan (requests and tokens a minute)."""
    name = (name or "").strip() if isinstance(name, str) else ""
    if not name or len(name) > MAX_KEY_NAME:
        raise ClientError(f"A key needs a name of 1 to {MAX_KEY_NAME} characters.", code="invalid_name", param="name")
    valid = set(ApiKey.Scope.values)
    if not isinstance(scopes, list | tuple) or not scopes or not all(isinstance(s, str) and s in valid for s in scopes):
        raise ClientError(
            f"Choose at least one scope from: {', '.join(sorted(valid))}.", code="invalid_scopes", param="scopes"
        )
    if expires_at is not None and expires_at <= timezone.now():
        raise ClientError("The expiry must be in the future.", code="invalid_expiry", param="expires_at")
    for param, cap in (("requests_per_minute", requests_per_minute), ("tokens_per_minute", tokens_per_minute)):
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_KEY_CAP):
            raise ClientError(
                f"A key's {param} must be a whole number from 1 to {MAX_KEY_CAP:,}.", param=param, code="invalid_limit"
            )
    secret = secrets.token_urlsafe(KEY_SECRET_BYTES)
    while True:
        prefix = secrets.token_hex(KEY_PREFIX_BYTES)
        if not ApiKey.objects.filter(prefix=prefix).exists():
            break
    api_key = ApiKey.objects.create(
        user=user,
        name=name,
        prefix=prefix,
        secret_hash=_hash_secret(secret),
        scopes=sorted(set(scopes)),
        expires_at=expires_at,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
    )
    return CreatedApiKey(api_key=api_key, key=f"cs_{prefix}_{secret}")


def api_key_revoke(*, user: User, api_key_id: int) -> ApiKey:
    """Revoke one of the user's own keys; it stops working on the next request. Idempotent."""
    try:
        api_key = ApiKey.objects.get(id=int(api_key_id), user_id=user.id)
    except (ApiKey.DoesNotExist, TypeError, ValueError, OverflowError):
        raise ClientError("That key does not exist.", code="not_found", status=404) from None
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


def api_key_authenticate(*, key: str) -> ApiKey | None:
    """The active key a client presented, or None. Records when it was last used (once a minute at most)."""
    if not isinstance(key, str) or not key.startswith("cs_"):
        return None
    parts = key.split("_", 2)
    if len(parts) != 3 or not parts[1] or not parts[2]:
        return None
    api_key = api_key_get_by_prefix(prefix=parts[1])
    if api_key is None or not hmac.compare_digest(api_key.secret_hash, _hash_secret(parts[2])):
        return None
    now = timezone.now()
    if not api_key.is_active_at(now) or not api_key.user.is_active:
        return None
    touched = (
        ApiKey.objects.filter(id=api_key.id)
        .filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - KEY_TOUCH_INTERVAL))
        .update(last_used_at=now)
    )
    if touched:
        api_key.last_used_at = now
    return api_key


# --- enforcement ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestLimits:
    tier: Tier
    max_context: int
    max_output: int  # the answer's budget when the request names none (the chat page's)
    priority: int
    output_cap: int = 0  # the most an answer may be given when asked for: the plan's cap, or the window


@dataclass(frozen=True)
class Admission:
    tier: Tier
    max_tokens: int
    priority: int
    # What the request took from its rate-limit buckets (each holds its capacity a minute).
    charges: tuple[Charge, ...] = ()


def request_limits(*, user: User, deployment: Deployment, api_key: ApiKey | None = None) -> RequestLimits:
    """What this user may ask of this deployment: refuses a model the tier does not include.

    Called before the prompt is assembled, so the window and the answer's budget are the tier's.
    """
    if api_key is not None and not api_key.has_scope(ApiKey.Scope.CHAT):
        raise ClientError("This API key does not have the 'chat' scope.", code="insufficient_scope", status=403)
    tier = tier_for_user_on_deployment(user=user, deployment=deployment)
    if not tier.includes_deployment:
        raise ClientError(
            f"Your plan ({tier}) does not include the model '{deployment.name}'.",
            code="model_not_allowed",
            status=403,
            param="model",
        )
    max_context = min(deployment.max_context, tier.max_context or deployment.max_context)
    max_output = min(deployment.default_max_tokens, tier.max_output_tokens or deployment.default_max_tokens)
    output_cap = min(tier.max_output_tokens or max_context, max_context)
    return RequestLimits(
        tier=tier, max_context=max_context, max_output=max_output, priority=tier.priority, output_cap=output_cap
    )


def request_size_check(*, chars: int, limits: RequestLimits) -> None:
    """Refuse a prompt of `chars` characters that cannot fit the window (400 context_length_exceeded)
    before anything is spent on it: no tokenizing, no moderation, no rate-limit budget.

    Cheap by design, so it bounds characters rather than counting tokens: past
    `PROMPT_MAX_CHARS_PER_TOKEN` characters a token on average, a prompt is refused without being
    tokenized. English and code average about 4 in the BPE vocabularies served here; only runs of
    whitespace or of one repeated symbol reach more. Anything under the bound is counted exactly
    afterwards."""
    most = limits.max_context * settings.PROMPT_MAX_CHARS_PER_TOKEN
    if chars > most:
        raise ClientError(
            f"This model's maximum context length is {limits.max_context} tokens, and {chars:,} characters "
            f"cannot fit in it (at most {most:,} are accepted). Please shorten the messages.",
            code="context_length_exceeded",
            param="messages",
        )


def request_admit(
    *,
    user: User,
    deployment: Deployment,
    prompt_tokens: int,
    max_tokens: int,
    api_key: ApiKey | None = None,
    limits: RequestLimits | None = None,
) -> Admission:
    """The one gate every request passes before its generation is created (socket and API alike).

    In order: the tier includes the model (403 model_not_allowed); the day's and month's token
    quotas, counted from the ledger plus what the user's unfinished generations may still use
    (429 quota_exceeded, retry when the period resets); requests per minute and tokens per minute
    (prompt + max_tokens), from token buckets of the user's (every key of theirs and the browser
    share them) and, where the API key has caps of its own, of the key's, taken from all in one step
    or from none (429 rate_limited, naming the requests' limits first when several are short). Returns the answer's max_tokens, capped to what the tier and the quota leave,
    and the queue priority. `limits` is request_limits' answer when the caller already has it.
    """
    if limits is None:
        limits = request_limits(user=user, deployment=deployment, api_key=api_key)
    tier = limits.tier
    max_tokens = max(1, min(max_tokens, limits.output_cap or limits.max_output))
    if prompt_tokens + max_tokens > limits.max_context:
        max_tokens = limits.max_context - prompt_tokens
        if max_tokens < 1:
            raise ClientError(
                "This message is too long for your plan's context window.", code="context_length_exceeded"
            )

    left = _quota_left(user=user, tier=tier, needed=prompt_tokens + 1)
    if left is not None:
        max_tokens = min(max_tokens, left - prompt_tokens)

    # The plan's buckets are the user's, shared by all their keys and the browser; a key's own caps
    # (optional, lower) are buckets of the key's, charged in the same step.
    owners = [(f"user:{user.id}", tier.requests_per_minute, tier.tokens_per_minute, "your plan's")]
    if api_key is not None:
        owners.append((f"key:{api_key.id}", api_key.requests_per_minute, api_key.tokens_per_minute, "this API key's"))
    token_caps = [tokens for _, _, tokens, _ in owners if tokens]
    if token_caps and prompt_tokens + max_tokens > min(token_caps):
        max_tokens = max(1, min(token_caps) - prompt_tokens)
    charges, limited = [], []
    for subject, requests, _, whose in owners:
        if requests:
            charges.append(Charge(f"{subject}:requests", requests, MINUTE_S))
            limited.append(f"{whose} limit of {requests} requests a minute")
    for subject, _, tokens, whose in owners:
        if tokens:
            charges.append(Charge(f"{subject}:tokens", tokens, MINUTE_S, prompt_tokens + max_tokens))
            limited.append(f"{whose} limit of {tokens:,} tokens a minute")
    # All the buckets in one step: a request one of them refuses takes nothing from the others.
    refusal = buckets_consume(charges)
    if refusal is not None:
        raise _rate_limited(limited[refusal.index], refusal.retry_after)
    return Admission(tier=tier, max_tokens=max_tokens, priority=limits.priority, charges=tuple(charges))


@dataclass(frozen=True)
class BucketLevel:
    """One rate limit as a client is told it: its size, what is left now, and the seconds until it
    is full again (a token bucket refills continuously)."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True)
class RateLimitLevels:
    requests: BucketLevel | None  # None: no such limit
    tokens: BucketLevel | None


def rate_limit_levels(*, user: User, api_key: ApiKey | None = None) -> RateLimitLevels:
    """The requests and tokens a minute the user (with this key) has left, read from the same
    buckets `request_admit` charges, without taking anything. Where the plan and the key both cap
    one, the one with less left is what binds, and is the one reported."""
    tier = tier_for_user(user=user)
    caps: dict[str, list[tuple[str, int]]] = {"requests": [], "tokens": []}
    owners = [(f"user:{user.id}", tier.requests_per_minute, tier.tokens_per_minute)]
    if api_key is not None:
        owners.append((f"key:{api_key.id}", api_key.requests_per_minute, api_key.tokens_per_minute))
    for subject, requests, tokens in owners:
        if requests:
            caps["requests"].append((f"{subject}:requests", requests))
        if tokens:
            caps["tokens"].append((f"{subject}:tokens", tokens))
    listed = caps["requests"] + caps["tokens"]
    levels = [
        BucketLevel(limit, int(level), (limit - level) * MINUTE_S / limit)
        for (_, limit), level in zip(
            listed, buckets_peek([Charge(key, limit, MINUTE_S) for key, limit in listed]), strict=True
        )
    ]
    split = len(caps["requests"])
    return RateLimitLevels(requests=_binding(levels[:split]), tokens=_binding(levels[split:]))


def _binding(levels: list[BucketLevel]) -> BucketLevel | None:
    return min(levels, key=lambda level: (level.remaining, level.limit), default=None)


def admission_refund(*, admission: Admission) -> None:
    """Give back what an admitted request took from its rate limits, when it goes no further after
    all (input moderation blocked the message it was admitted for)."""
    buckets_refund(list(admission.charges))


def _quota_left(*, user: User, tier: Tier, needed: int) -> int | None:
    """The tokens the day's and month's quotas leave the user (None: no quota), counted from the
    ledger plus what their unfinished generations may still use; 429 quota_exceeded when that is
    fewer than `needed`."""
    if not (tier.tokens_per_day or tier.tokens_per_month):
        return None
    now = timezone.now()
    reserved = quota_tokens_reserved(user=user)
    least = None
    periods = quota_periods(tier=tier, now=now)
    used = ledger().tokens_since_each(user=user, since=[period.since for period in periods])
    for period, tokens in zip(periods, used, strict=True):
        left = period.limit - tokens - reserved
        if left < needed:
            raise ClientError(
                f"You have used {period.owned} {period.limit:,} tokens on your plan ({tier}). "
                f"It resets at {period.resets_at:%Y-%m-%d %H:%M} UTC.",
                code="quota_exceeded",
                status=429,
                retry_after=max(1, int((period.resets_at - now).total_seconds()) + 1),
            )
        least = left if least is None else min(least, left)
    return least


def _rate_limited(limit: str, retry_after: int) -> ClientError:
    return ClientError(
        f"You have reached {limit}. Try again in {retry_after} seconds.",
        code="rate_limited",
        status=429,
        retry_after=retry_after,
    )


# --- the lighter endpoints ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Action:
    field: str  # the Tier field that holds its limit
    period_s: int
    what: str  # how a refusal names the limit


HOUR_S = 60 * MINUTE_S
DAY_S = 24 * HOUR_S
ACTIONS = {
    "moderation": _Action("moderations_per_minute", MINUTE_S, "moderation requests a minute"),
    "model_list": _Action("model_lists_per_minute", MINUTE_S, "model lists a minute"),
    "conversation": _Action("conversations_per_hour", HOUR_S, "new conversations an hour"),
    "api_key": _Action("api_keys_per_day", DAY_S, "new API keys a day"),
    "file_upload": _Action("file_uploads_per_hour", HOUR_S, "file uploads an hour"),
    "document": _Action("documents_per_day", DAY_S, "files processed a day"),
    "file_search": _Action("file_searches_per_minute", MINUTE_S, "file searches a minute"),
    "request": _Action("other_requests_per_minute", MINUTE_S, "page and API requests a minute"),
}
# A visitor who has not signed in has no plan: their requests (the sign-in page, a shared
# conversation, the API's schema) share one bucket per client address.
ANONYMOUS_REQUESTS_PER_MINUTE = 120


def _action_charge(*, user: User, tier: Tier, action: str) -> tuple[Charge, str] | None:
    spec = ACTIONS[action]
    limit = getattr(tier, spec.field)
    if not limit:
        return None
    return Charge(f"user:{user.id}:{action}", limit, spec.period_s), f"your plan's limit of {limit} {spec.what}"


def action_admit(*, user: User, action: str) -> None:
    """Count one `action` (a name in ACTIONS) against the user's plan, or refuse it (429 rate_limited).

    A bucket of the user's own per action, whichever key or session the request came with, so a
    plan's limit is the user's however many keys they make.
    """
    actions_admit(user=user, actions=(action,))


def actions_admit(*, user: User, actions: Collection[str]) -> None:
    """Count one of each of `actions` (names in ACTIONS) against the user's plan, from all their
    buckets in one step or from none (429 rate_limited, naming the first that is short): an upload
    refused for the day's processing has not used one of the hour's uploads."""
    tier = tier_for_user(user=user)
    charged = [c for action in actions if (c := _action_charge(user=user, tier=tier, action=action)) is not None]
    refusal = buckets_consume([charge for charge, _ in charged])
    if refusal is not None:
        raise _rate_limited(charged[refusal.index][1], refusal.retry_after)


def address_admit(*, address: str) -> None:
    """Count one request from a visitor who has not signed in against their client address's bucket,
    or refuse it (429 rate_limited)."""
    limit = ANONYMOUS_REQUESTS_PER_MINUTE
    refusal = buckets_consume([Charge(f"address:{address}:requests", limit, MINUTE_S)])
    if refusal is not None:
        raise _rate_limited(f"the limit of {limit} requests a minute from one address", refusal.retry_after)


# Classifier input is charged as tokens at about four characters a token (English text in a BPE
# vocabulary), which needs no tokenizer: counting exactly would cost what the limit is there to save.
MODERATION_CHARS_PER_TOKEN = 4


def moderation_tokens(*, texts: list[str]) -> int:
    """What scoring `texts` is charged as, in tokens (estimated from their length)."""
    return max(1, -(-sum(len(text) for text in texts) // MODERATION_CHARS_PER_TOKEN))


def moderation_admit(*, user: User, texts: list[str]) -> None:
    """Admit a /v1/moderations request before its texts are scored, and charge it to the ledger.

    Its input's tokens (estimated) count towards the day's and month's quotas (429 quota_exceeded)
    and, with one request, towards the user's tokens and moderation requests a minute, taken in one
    step or not at all (429 rate_limited). The ledger row (kind "moderation", free of charge) is what
    makes the quotas count it.
    """
    tier = tier_for_user(user=user)
    tokens = moderation_tokens(texts=texts)
    _quota_left(user=user, tier=tier, needed=tokens)
    charges, limited = [], []
    if (charged := _action_charge(user=user, tier=tier, action="moderation")) is not None:
        charges.append(charged[0])
        limited.append(charged[1])
    if tier.tokens_per_minute:
        charges.append(Charge(f"user:{user.id}:tokens", tier.tokens_per_minute, MINUTE_S, tokens))
        limited.append(f"your plan's limit of {tier.tokens_per_minute:,} tokens a minute")
    refusal = buckets_consume(charges)
    if refusal is not None:
        raise _rate_limited(limited[refusal.index], refusal.retry_after)
    ledger().moderation_charge(user_id=user.id, tier_id=tier.id, tokens=tokens)


# --- embeddings -----------------------------------------------------------------------------------


def api_request_admit(*, user: User, deployment: Deployment, tokens: int, api_key: ApiKey | None = None) -> Admission:
    """Admit a request to a model that is not a generation: /v1/embeddings with its `tokens` input
    tokens (counted exactly by the caller), /tokenize and /detokenize with none (a request only).

    The same plan as a chat request's: the tier includes the model (403 model_not_allowed); the
    day's and month's quotas (429 quota_exceeded); the requests and tokens a minute of the user's
    buckets and, where the key has caps of its own, the key's, taken in one step or not at all
    (429 rate_limited). The key's scope is the view's to check. Nothing is written to the ledger
    until the vectors are made (`embedding_record`); `admission_refund` gives the buckets back if
    they never are.
    """
    tier = tier_for_user_on_deployment(user=user, deployment=deployment)
    if not tier.includes_deployment:
        raise ClientError(
            f"Your plan ({tier}) does not include the model '{deployment.name}'.",
            code="model_not_allowed",
            status=403,
            param="model",
        )
    if tokens:
        _quota_left(user=user, tier=tier, needed=tokens)
    owners = [(f"user:{user.id}", tier.requests_per_minute, tier.tokens_per_minute, "your plan's")]
    if api_key is not None:
        owners.append((f"key:{api_key.id}", api_key.requests_per_minute, api_key.tokens_per_minute, "this API key's"))
    charges, limited = [], []
    for subject, requests, per_minute, whose in owners:
        if requests:
            charges.append(Charge(f"{subject}:requests", requests, MINUTE_S))
            limited.append(f"{whose} limit of {requests} requests a minute")
        if per_minute and tokens:
            if tokens > per_minute:
                raise ClientError(
                    f"The input's {tokens:,} tokens exceed {whose} limit of {per_minute:,} tokens a minute.",
                    code="rate_limited",
                    status=429,
                    param="input",
                )
            charges.append(Charge(f"{subject}:tokens", per_minute, MINUTE_S, tokens))
            limited.append(f"{whose} limit of {per_minute:,} tokens a minute")
    refusal = buckets_consume(charges)
    if refusal is not None:
        raise _rate_limited(limited[refusal.index], refusal.retry_after)
    return Admission(tier=tier, max_tokens=0, priority=tier.priority, charges=tuple(charges))


def embedding_record(*, user: User, deployment: Deployment, tokens: int) -> None:
    """The ledger row of an embeddings request: its input tokens at the tier's prompt price for the
    deployment (an embedding has no output tokens)."""
    ledger().embedding_charge(user_id=user.id, deployment_id=deployment.id, tokens=tokens)


# --- the service's work on a user's files ---------------------------------------------------------


def quota_check(*, user: User, tokens: int) -> None:
    """429 quota_exceeded when the day's or month's quota leaves the user fewer than `tokens`: for
    work done for the user in the background (a file's moderation and embedding), checked before it
    starts and charged when it is done (`billing.services.processing_usage_record`)."""
    _quota_left(user=user, tier=tier_for_user(user=user), needed=tokens)


# --- signing in ----------------------------------------------------------------------------------

# Failed sign-ins allowed at once, then one more per LOGIN_PERIOD_S / capacity (a token bucket):
# per account, whatever address tries it, and per client address, whatever accounts it tries.
LOGIN_FAILURES_PER_ACCOUNT = 5
LOGIN_FAILURES_PER_ADDRESS = 20
LOGIN_PERIOD_S = 15 * MINUTE_S


def _login_account_key(username: str) -> str:
    # Hashed: the key holds anything a client typed; folded, so "Alice" and "alice" share it.
    return "login:account:" + hashlib.sha256(username.strip().casefold().encode()).hexdigest()


def _login_charges(*, username: str | None, address: str | None) -> list[Charge]:
    charges = []
    if username is not None:
        charges.append(Charge(_login_account_key(username), LOGIN_FAILURES_PER_ACCOUNT, LOGIN_PERIOD_S))
    if address is not None:
        charges.append(Charge(f"login:address:{address}", LOGIN_FAILURES_PER_ADDRESS, LOGIN_PERIOD_S))
    return charges


def login_attempt_admit(*, username: str | None, address: str | None) -> list[Charge]:
    """Take one attempt from the account's and the address's sign-in buckets before the password is
    checked, or refuse it (429 login_locked) without checking it: a locked account stays locked
    for the right password too, or guessing would go on. Give the attempt back when it succeeds
    (`login_attempt_succeeded`), so only failures count.

    A sign-in through an identity provider pays the address's bucket before it knows the account,
    then the account's (None leaves a bucket out): a locked account is locked for it too."""
    charges = _login_charges(username=username, address=address)
    refusal = buckets_consume(charges)
    if refusal is not None:
        minutes = max(1, -(-refusal.retry_after // MINUTE_S))
        whom = "this account" if username is not None and refusal.index == 0 else "your network address"
        raise ClientError(
            f"Too many failed sign-ins for {whom}. Try again in {minutes} minute{'s' if minutes > 1 else ''}, "
            "or ask an administrator to unlock it.",
            code="login_locked",
            status=429,
            retry_after=refusal.retry_after,
        )
    return charges


def login_attempt_succeeded(*, charges: list[Charge]) -> None:
    buckets_refund(charges)


def login_unlock(*, usernames: Collection[str] = (), addresses: Collection[str] = ()) -> None:
    """Lift the sign-in locks of these accounts and client addresses at once (an admin's action)."""
    buckets_reset([_login_account_key(name) for name in usernames] + [f"login:address:{a}" for a in addresses])


# --- signing up ----------------------------------------------------------------------------------

SIGNUP_PERIOD_S = 3600


def _signup_network(address: str) -> str:
    """The network an address belongs to for sign-ups: its IPv4 /24, or its IPv6 /64 (what one
    subscriber is routed, so a host has all of it to choose from); empty for what is no address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return ""
    return str(ipaddress.ip_network(f"{ip}/{24 if ip.version == 4 else 64}", strict=False))


def signup_admit(*, address: str) -> None:
    """Count an account about to be created against its client address's and its network's
    sign-ups an hour (settings.SIGNUPS_PER_*_PER_HOUR), both or neither, or refuse it (429
    signup_limited). The address is the client's behind a proxy too (chatsite.proxies)."""
    charges, whom = [], []
    if settings.SIGNUPS_PER_ADDRESS_PER_HOUR:
        charges.append(Charge(f"signup:address:{address}", settings.SIGNUPS_PER_ADDRESS_PER_HOUR, SIGNUP_PERIOD_S))
        whom.append("your network address")
    network = _signup_network(address)
    if settings.SIGNUPS_PER_NETWORK_PER_HOUR and network:
        charges.append(Charge(f"signup:network:{network}", settings.SIGNUPS_PER_NETWORK_PER_HOUR, SIGNUP_PERIOD_S))
        whom.append("your network")
    refusal = buckets_consume(charges)
    if refusal is not None:
        minutes = max(1, -(-refusal.retry_after // MINUTE_S))
        raise ClientError(
            f"Too many accounts have been created from {whom[refusal.index]} lately. "
            f"Try again in {minutes} minute{'s' if minutes > 1 else ''}.",
            code="signup_limited",
            status=429,
            retry_after=refusal.retry_after,
        )


# --- verifying an email address -------------------------------------------------------------------

EMAIL_VERIFICATION_SALT = "accounts.email-verification"
EMAIL_VERIFICATION_TEXT = """Hello {username},

Open this link to confirm that {email} is your address (it works for {days} days):

{link}

If you did not sign up, ignore this email.
"""


def email_verification_token(*, user: User) -> str:
    """A signed token naming the user and the address: it verifies that address only while it is
    still the account's, and only for EMAIL_VERIFICATION_MAX_AGE_S."""
    return signing.dumps({"user": user.pk, "email": user.email}, salt=EMAIL_VERIFICATION_SALT)


def email_verification_send(*, user: User, link_for: Callable[[str], str]) -> None:
    """Email the account a verification link (`link_for(token)` makes it absolute), at most
    EMAIL_VERIFICATIONS_PER_HOUR an hour per account (429 verification_limited)."""
    if not user.email:
        raise ClientError("The account has no email address to verify.", code="no_email")
    refusal = buckets_consume([Charge(f"verify:user:{user.pk}", settings.EMAIL_VERIFICATIONS_PER_HOUR, HOUR_S)])
    if refusal is not None:
        minutes = max(1, -(-refusal.retry_after // MINUTE_S))
        raise ClientError(
            f"A link was sent a few times already. Try again in {minutes} minute{'s' if minutes > 1 else ''}.",
            code="verification_limited",
            status=429,
            retry_after=refusal.retry_after,
        )
    text = EMAIL_VERIFICATION_TEXT.format(
        username=user.username,
        email=user.email,
        days=settings.EMAIL_VERIFICATION_MAX_AGE_S // 86400 or 1,
        link=link_for(email_verification_token(user=user)),
    )
    send_mail("Confirm your email address", text, None, [user.email])


def email_verify(*, token: str) -> User | None:
    """The user whose address `token` verifies, now marked verified; None for a token that is
    tampered with, expired, or names an address the account no longer has."""
    try:
        claim = signing.loads(token, salt=EMAIL_VERIFICATION_SALT, max_age=settings.EMAIL_VERIFICATION_MAX_AGE_S)
    except signing.BadSignature:
        return None
    if not isinstance(claim, dict) or not isinstance(claim.get("user"), int) or not isinstance(claim.get("email"), str):
        return None
    user = User.objects.filter(id=claim["user"], email__iexact=claim["email"]).exclude(email="").first()
    if user is None:
        return None
    User.objects.filter(id=user.pk).update(verified_email=user.email)
    user.verified_email = user.email
    return user


PASSWORD_RESET_PERIOD_S = 3600


def password_reset_admit(*, address: str, email: str) -> None:
    """Count a password-reset request against its client address's and its email address's resets
    an hour, both or neither, or refuse it (429 reset_limited). Counted whether or not an account
    has that email, so the limit says nothing about which do."""
    charges = [
        Charge(f"reset:address:{address}", settings.PASSWORD_RESETS_PER_ADDRESS_PER_HOUR, PASSWORD_RESET_PERIOD_S),
        Charge(
            f"reset:email:{hashlib.sha256(email.strip().lower().encode()).hexdigest()}",
            settings.PASSWORD_RESETS_PER_EMAIL_PER_HOUR,
            PASSWORD_RESET_PERIOD_S,
        ),
    ]
    refusal = buckets_consume(charges)
    if refusal is not None:
        minutes = max(1, -(-refusal.retry_after // MINUTE_S))
        raise ClientError(
            f"Too many password resets were asked for lately. Try again in {minutes} minute{'s' if minutes > 1 else ''}.",
            code="reset_limited",
            status=429,
            retry_after=refusal.retry_after,
        )


SIGN_IN_CHANGED_TEXT = """Hello {username},

How your account signs in changed: {what} ({how}), on {when} UTC.

If this was not you, reset your password now from the sign-in page, and tell the service's operator.
"""


def sign_in_changed_notify(*, user: User, how: str, subject: str = "Your password was changed") -> None:
    """Tell the account's email address that how it signs in changed (its password, its second
    factor), once the change commits: a person who did not change it learns of it. No email
    address: nothing to tell."""
    if not user.email:
        return
    text = SIGN_IN_CHANGED_TEXT.format(
        username=user.username, what=subject.lower(), how=how, when=timezone.now().strftime("%Y-%m-%d %H:%M")
    )
    transaction.on_commit(lambda: send_mail(subject, text, None, [user.email], fail_silently=True), robust=True)


# --- the second factor: an authenticator app's codes, and recovery codes ---------------------------

RECOVERY_CODES = 10
# A code from the step before or after the present one is accepted too: a phone's clock a little
# off, or a code typed as it turned.
TOTP_VALID_WINDOW = 1


def totp_secret_new() -> str:
    return pyotp.random_base32()


def _recovery_hash(code: str) -> str:
    return hashlib.sha256(code.replace("-", "").strip().lower().encode()).hexdigest()


def recovery_codes_new(*, user: User) -> list[str]:
    """New recovery codes for the user, replacing any they had; shown once, stored as hashes."""
    codes = [f"{secrets.token_hex(3)}-{secrets.token_hex(3)}" for _ in range(RECOVERY_CODES)]
    with transaction.atomic():
        RecoveryCode.objects.filter(user=user).delete()
        RecoveryCode.objects.bulk_create(RecoveryCode(user=user, code_hash=_recovery_hash(code)) for code in codes)
    return codes


def totp_device_confirm(*, user: User, secret: str, code: str) -> list[str]:
    """Turn on the second factor with the authenticator app given `secret`, once it shows a code that
    fits; returns the recovery codes (shown once). A wrong code is a 400 and turns nothing on."""
    totp = pyotp.TOTP(secret)
    now = timezone.now()
    if not code.strip().isdigit() or not totp.verify(code.strip(), for_time=now, valid_window=TOTP_VALID_WINDOW):
        raise ClientError("That code does not match. Check the app's clock and try the newest code.", code="bad_code")
    with transaction.atomic():
        TotpDevice.objects.update_or_create(user=user, defaults={"secret": secret, "last_step": totp.timecode(now)})
        codes = recovery_codes_new(user=user)
    sign_in_changed_notify(user=user, how="two-factor sign-in turned on", subject="Two-factor sign-in is on")
    return codes


def totp_device_remove(*, user: User) -> None:
    """Turn the second factor off: the authenticator and the recovery codes go."""
    with transaction.atomic():
        TotpDevice.objects.filter(user=user).delete()
        RecoveryCode.objects.filter(user=user).delete()
    sign_in_changed_notify(user=user, how="two-factor sign-in turned off", subject="Two-factor sign-in is off")


def second_factor_verify(*, user: User, code: str) -> bool:
    """Whether `code` is the user's second factor now: an authenticator code not used before (each
    time step once, taken by a conditional update, so two requests cannot both use it), or an unused
    recovery code (used up by this)."""
    code = code.strip().replace(" ", "")
    device = TotpDevice.objects.filter(user=user).first()
    if device is not None and code.isdigit() and len(code) == 6:
        totp = pyotp.TOTP(device.secret)
        now = timezone.now()
        for offset in range(-TOTP_VALID_WINDOW, TOTP_VALID_WINDOW + 1):
            step = totp.timecode(now) + offset
            if secrets.compare_digest(totp.generate_otp(step), code):
                return bool(TotpDevice.objects.filter(id=device.id, last_step__lt=step).update(last_step=step))
        return False
    if len(code) >= 12:
        return bool(
            RecoveryCode.objects.filter(user=user, code_hash=_recovery_hash(code), used_at__isnull=True).update(
                used_at=timezone.now()
            )
        )
    return False


def user_settings_update(
    *,
    user: User,
    about_me: str,
    answer_style: str,
    default_model: str,
    theme: str,
    allowed_models: Collection[str],
) -> UserSettings:
    """Save the person's settings. `allowed_models`: the deployments their plan may use now (the
    caller reads them from the inference layer); a default model outside them is refused."""
    if default_model and default_model not in allowed_models:
        raise ClientError(
            f"Your plan does not include the model '{default_model}'.", code="model_not_allowed", param="default_model"
        )
    if theme not in UserSettings.Theme.values:
        raise ClientError("Choose light, dark or the system's theme.", code="invalid_theme", param="theme")
    if len(about_me) > UserSettings.ABOUT_MAX_CHARS or len(answer_style) > UserSettings.STYLE_MAX_CHARS:
        raise ClientError("Custom instructions are too long.", code="invalid_instructions")
    found, _ = UserSettings.objects.update_or_create(
        user_id=user.id,
        defaults={
            "about_me": about_me.strip(),
            "answer_style": answer_style.strip(),
            "default_model": default_model,
            "theme": theme,
        },
    )
    return found
