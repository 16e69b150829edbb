"""Passkeys (WebAuthn): registering one, and signing in with one, as the second factor or alone.

The checks are py_webauthn's (Duo Labs): the challenge, the origin and relying-party id the browser
signed, the signature against the stored public key, and the authenticator's signature count (a
count that does not grow means a cloned key: refused). Each challenge is made here, kept in the
session for one use and CHALLENGE_TTL_S at most (`passkey_challenge_take`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    options_to_json,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers.exceptions import WebAuthnException
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    AuthenticatorTransport,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from accounts.models import Passkey, User
from accounts.services import sign_in_changed_notify
from chatsite.errors import ClientError

CHALLENGE_SESSION = "accounts.passkey_challenge"
CHALLENGE_TTL_S = 300
MAX_PASSKEYS = 20
NAME_MAX = 64
RP_NAME = "Chat"
TRANSPORTS = {t.value for t in AuthenticatorTransport}


@dataclass(frozen=True)
class RelyingParty:
    """Who the passkeys are for: the site's domain (PASSKEY_RP_ID) and the origins a browser may
    sign for (PASSKEY_ORIGINS); by default the request's own host and origin."""

    id: str
    origins: tuple[str, ...]


def relying_party(request: HttpRequest) -> RelyingParty:
    host = request.get_host()
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    origin = f"{'https' if request.is_secure() else 'http'}://{host}"
    return RelyingParty(
        id=settings.PASSKEY_RP_ID or hostname.strip("[]"),
        origins=tuple(settings.PASSKEY_ORIGINS) or (origin,),
    )


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _user_handle(user: User) -> bytes:
    """The id the authenticator keeps for the account: derived from its id with the site's key, so
    it names no one to anybody else and needs no column."""
    return hmac.new(settings.SECRET_KEY.encode(), f"passkey-user:{user.pk}".encode(), hashlib.sha256).digest()


def _challenge_store(request: HttpRequest, *, purpose: str, challenge: bytes, user_id: int | None) -> None:
    request.session[CHALLENGE_SESSION] = {
        "purpose": purpose,
        "challenge": _b64url(challenge),
        "user": user_id,
        "at": time.time(),
    }


def passkey_challenge_take(request: HttpRequest, *, purpose: str, user_id: int | None) -> bytes:
    """The challenge this session was given for `purpose` (and this user), taken out: it works once,
    and for CHALLENGE_TTL_S. A 400 when there is none that fits."""
    stored = request.session.pop(CHALLENGE_SESSION, None)
    if (
        not isinstance(stored, dict)
        or stored.get("purpose") != purpose
        or stored.get("user") != user_id
        or not isinstance(stored.get("at"), int | float)
        or time.time() - stored["at"] > CHALLENGE_TTL_S
        or not isinstance(stored.get("challenge"), str)
    ):
        raise ClientError("That passkey request expired. Try again.", code="passkey_expired")
    return base64.urlsafe_b64decode(stored["challenge"] + "=" * (-len(stored["challenge"]) % 4))


def _refused(message: str = "That passkey did not work.") -> ClientError:
    return ClientError(message, code="passkey_refused")


def passkey_registration_options(*, request: HttpRequest, user: User) -> dict[str, Any]:
    """Options for navigator.credentials.create(): a new challenge (kept in the session), the
    account's existing passkeys excluded, a discoverable credential preferred (it can sign in alone)."""
    rp = relying_party(request)
    options = generate_registration_options(
        rp_id=rp.id,
        rp_name=RP_NAME,
        user_name=user.get_username(),
        user_id=_user_handle(user),
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.PREFERRED, user_verification=UserVerificationRequirement.PREFERRED
        ),
        exclude_credentials=[_descriptor(passkey) for passkey in Passkey.objects.filter(user=user)],
    )
    _challenge_store(request, purpose="register", challenge=options.challenge, user_id=user.pk)
    return json.loads(options_to_json(options))


def _descriptor(passkey: Passkey) -> PublicKeyCredentialDescriptor:
    return PublicKeyCredentialDescriptor(
        id=base64.urlsafe_b64decode(passkey.credential_id + "=" * (-len(passkey.credential_id) % 4)),
        transports=[AuthenticatorTransport(t) for t in passkey.transports if t in TRANSPORTS] or None,
    )


def passkey_register(*, request: HttpRequest, user: User, name: str, credential: dict[str, Any]) -> Passkey:
    """Keep the passkey the browser made for this session's registration challenge, by `name`."""
    name = name.strip()
    if not name or len(name) > NAME_MAX or "\x00" in name:
        raise ClientError(f"Give the passkey a name of 1 to {NAME_MAX} characters.", code="invalid_name", param="name")
    challenge = passkey_challenge_take(request, purpose="register", user_id=user.pk)
    if Passkey.objects.filter(user=user).count() >= MAX_PASSKEYS:
        raise ClientError(f"An account keeps {MAX_PASSKEYS} passkeys at most.", code="too_many_passkeys")
    rp = relying_party(request)
    try:
        verified = verify_registration_response(
            credential=credential, expected_challenge=challenge, expected_rp_id=rp.id, expected_origin=list(rp.origins)
        )
    except (WebAuthnException, ValueError, KeyError, TypeError) as exc:
        raise _refused(f"That passkey could not be registered: {exc}") from None
    transports = (
        credential.get("response", {}).get("transports") if isinstance(credential.get("response"), dict) else []
    )
    credential_id = _b64url(verified.credential_id)
    if Passkey.objects.filter(credential_id=credential_id).exists():
        raise ClientError("That passkey is registered already.", code="passkey_exists", status=409)
    passkey = Passkey.objects.create(
        user=user,
        name=name,
        credential_id=credential_id,
        public_key=verified.credential_public_key,
        sign_count=verified.sign_count,
        transports=[t for t in transports if t in TRANSPORTS] if isinstance(transports, list) else [],
    )
    sign_in_changed_notify(user=user, how=f"passkey “{name}” added", subject="A passkey was added")
    return passkey


def passkey_authentication_options(*, request: HttpRequest, user: User | None) -> dict[str, Any]:
    """Options for navigator.credentials.get(): the user's passkeys (the second step of a sign-in),
    or any this site's (None: signing in with a passkey alone, which must verify the person)."""
    rp = relying_party(request)
    allowed = [_descriptor(passkey) for passkey in Passkey.objects.filter(user=user)] if user is not None else []
    options = generate_authentication_options(
        rp_id=rp.id,
        allow_credentials=allowed,
        user_verification=UserVerificationRequirement.PREFERRED if user else UserVerificationRequirement.REQUIRED,
    )
    _challenge_store(
        request, purpose="authenticate", challenge=options.challenge, user_id=user.pk if user is not None else None
    )
    return json.loads(options_to_json(options))


def passkey_authenticate(*, request: HttpRequest, user: User | None, credential: dict[str, Any]) -> Passkey:
    """The passkey that signed this session's challenge: one of `user`'s, or (None) whichever
    account's it is, then with the person verified by the authenticator (a PIN, a fingerprint) and
    the account it names. Its count of signatures is moved on by a conditional update, so the same
    answer sent twice works once."""
    challenge = passkey_challenge_take(request, purpose="authenticate", user_id=user.pk if user is not None else None)
    credential_id = credential.get("id") if isinstance(credential, dict) else None
    if not isinstance(credential_id, str) or not credential_id or len(credential_id) > 1400:
        raise _refused()
    found = Passkey.objects.select_related("user").filter(credential_id=credential_id)
    passkey = (found.filter(user=user) if user is not None else found).first()
    if passkey is None:
        raise _refused("That passkey is not registered here.")
    rp = relying_party(request)
    try:
        verified = verify_authentication_response(
            credential=credential,
            expected_challenge=challenge,
            expected_rp_id=rp.id,
            expected_origin=list(rp.origins),
            credential_public_key=bytes(passkey.public_key),
            credential_current_sign_count=passkey.sign_count,
            require_user_verification=user is None,
        )
    except (WebAuthnException, ValueError, KeyError, TypeError):
        raise _refused() from None
    if user is None:
        handle = credential.get("response", {}).get("userHandle")
        if not isinstance(handle, str) or not hmac.compare_digest(handle, _b64url(_user_handle(passkey.user))):
            raise _refused()
    with transaction.atomic():
        moved = Passkey.objects.filter(id=passkey.id, sign_count=passkey.sign_count).update(
            sign_count=verified.new_sign_count, last_used_at=timezone.now()
        )
    if not moved:
        raise _refused()
    return passkey


def passkey_of_user(*, user: User, passkey_id: int) -> Passkey:
    """One of the user's passkeys (404 for another's, or none)."""
    passkey = Passkey.objects.filter(id=passkey_id, user=user).first()
    if passkey is None:
        raise ClientError("No such passkey.", code="not_found", status=404)
    return passkey


def passkey_remove(*, user: User, passkey_id: int) -> Passkey:
    passkey = passkey_of_user(user=user, passkey_id=passkey_id)
    passkey.delete()
    sign_in_changed_notify(user=user, how=f"passkey “{passkey.name}” removed", subject="A passkey was removed")
    return passkey
