"""What an identity provider's answer means for an account: the account it is linked to, one it
may be linked to by a verified address, or a new one; and the tier its groups map to.

The rule that keeps a provider from taking over an account: a link is made only between an address
the provider says it verified and an account whose own address is confirmed here
(`User.verified_email`). An unverified address creates nothing and links nothing; an account that has
the address but never confirmed it is not linked either (whoever made it may not own the address).
"""

from __future__ import annotations

import logging
import re
import secrets

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import ExternalIdentity, Tier, User
from accounts.oidc import Provider, ProviderIdentity
from accounts.services import sign_in_changed_notify, signup_admit
from chatsite.errors import ClientError

log = logging.getLogger(__name__)

USERNAME_CHARS = re.compile(r"[^\w.@+-]")
USERNAME_MAX = 150


def _refused(message: str, code: str) -> ClientError:
    return ClientError(message, code=code, status=403)


def sso_user_resolve(*, provider: Provider, identity: ProviderIdentity, address: str) -> User:
    """The account this provider identity signs in to: the one linked to it; else the one whose
    confirmed address is the identity's verified one (linked now, its owner told); else a new
    account (counted against the address's sign-ups). Its tier follows the provider's mapping.
    Refusals are 403s that change nothing (429 for too many new accounts)."""
    linked = ExternalIdentity.objects.select_related("user").filter(provider=provider.slug, subject=identity.subject)
    found = linked.first()
    if found is not None:
        user = found.user
        updates: dict[str, object] = {"last_used_at": timezone.now()}
        if identity.email_verified:
            updates["email"] = identity.email
        ExternalIdentity.objects.filter(id=found.id).update(**updates)
    else:
        user = _link_or_create(provider=provider, identity=identity, address=address)
    if not user.is_active:
        raise _refused("This account is disabled.", "account_disabled")
    _tier_apply(provider=provider, identity=identity, user=user)
    return user


def _link_or_create(*, provider: Provider, identity: ProviderIdentity, address: str) -> User:
    name = provider.display_name
    if not identity.email or not identity.email_verified:
        raise _refused(
            f"{name} has not verified your email address, so it cannot sign you in here. "
            f"Verify the address with {name} and try again.",
            "sso_email_unverified",
        )
    email = identity.email
    holders = list(User.objects.filter(Q(email__iexact=email) | Q(verified_email__iexact=email))[:3])
    confirmed = [u for u in holders if u.email_verified and u.email.lower() == email.lower()]
    if len(confirmed) == 1:
        user = confirmed[0]
        with transaction.atomic():
            _identity_create(user=user, provider=provider, identity=identity)
        sign_in_changed_notify(
            user=user, how=f"signing in with {name} was linked to your account", subject=f"{name} sign-in linked"
        )
        return user
    if holders:
        raise _refused(
            "An account here uses that address but has not confirmed it. Sign in with its password and "
            "confirm the address from the settings page, then sign in with " + name + " again.",
            "sso_link_unconfirmed",
        )
    if not provider.create_accounts:
        raise _refused(f"No account here uses the address {name} gave. Ask an administrator for one.", "sso_no_account")
    signup_admit(address=address)
    with transaction.atomic():
        user = User(
            username=_username_free(identity.username_hint or email.split("@")[0]),
            email=email,
            verified_email=email,
            tier=Tier.objects.filter(is_default=True).first(),
        )
        user.set_unusable_password()
        user.save()
        _identity_create(user=user, provider=provider, identity=identity)
    return user


def _identity_create(*, user: User, provider: Provider, identity: ProviderIdentity) -> None:
    try:
        with transaction.atomic():
            ExternalIdentity.objects.create(
                user=user,
                provider=provider.slug,
                subject=identity.subject,
                email=identity.email,
                last_used_at=timezone.now(),
            )
    except IntegrityError:
        # The same person signing in twice at once: the other request linked it first.
        raise ClientError(
            "That sign-in is already being finished. Try again.", code="sso_conflict", status=409
        ) from None


def _username_free(hint: str) -> str:
    """A free username like the provider's (its characters reduced to Django's), numbered if taken."""
    base = USERNAME_CHARS.sub("", hint.split("@")[0])[: USERNAME_MAX - 8] or "user"
    candidate = base
    for _ in range(20):
        if not User.objects.filter(username__iexact=candidate).exists():
            return candidate
        candidate = f"{base}-{secrets.randbelow(10**6):06d}"
    return f"user-{secrets.token_hex(8)}"


def _tier_apply(*, provider: Provider, identity: ProviderIdentity, user: User) -> None:
    """With a tier claim configured, the first mapped group or role the person has sets their tier;
    none of them, the default tier. Applied at each sign-in, so leaving a group at the provider
    takes its tier away at the next one."""
    if not provider.tier_claim:
        return
    wanted: Tier | None = None
    for value, tier_name in provider.tier_map:
        if value in identity.groups:
            wanted = Tier.objects.filter(name=tier_name).first()
            if wanted is None:
                log.warning(
                    "identity provider %s maps %r to a tier that does not exist: %s", provider.slug, value, tier_name
                )
                continue
            break
    if wanted is None:
        wanted = Tier.objects.filter(is_default=True).first()
    if wanted is not None and user.tier_id != wanted.pk:
        user.tier = wanted
        user.save(update_fields=["tier"])


def linked_identity_remove(*, user: User, identity_id: int) -> ExternalIdentity:
    """Unlink one of the user's provider sign-ins (404 for another's or none). Refused while it is
    the account's only way in (no password, no other link)."""
    found = ExternalIdentity.objects.filter(id=identity_id, user=user).first()
    if found is None:
        raise ClientError("No such linked sign-in.", code="not_found", status=404)
    others = ExternalIdentity.objects.filter(user=user).exclude(id=found.id).exists()
    if not others and not user.has_usable_password():
        raise ClientError(
            "This is the only way into your account. Set a password or link another provider first.",
            code="last_sign_in",
            status=409,
        )
    found.delete()
    sign_in_changed_notify(user=user, how=f"signing in with {found.provider} was unlinked", subject="Sign-in unlinked")
    return found
