"""What the accounts pages keep in a person's session between requests, named in one place."""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth import login
from django.http import HttpRequest

from accounts.models import User

# A sign-in whose first step passed (a password, a provider) and whose second factor is awaited, in
# the (not signed-in) session, for PENDING_S at most.
PENDING_SESSION = "accounts.second_factor_pending"
PENDING_S = 300
# The provider this session signed in through, and when the person last proved who they are there.
SSO_SIGNED_IN_SESSION = "accounts.sso_provider"
SSO_REAUTHENTICATED_SESSION = "accounts.sso_reauthenticated_at"
# An authenticator app's secret shown for setup, until its first code confirms it.
SETUP_SESSION = "accounts.totp_setup_secret"


def reauthenticated_recently(request: HttpRequest) -> bool:
    """Whether this session signed in (or signed in again) through a provider within
    SSO_REAUTHENTICATE_S: what stands for the password of an account that has none."""
    at = request.session.get(SSO_REAUTHENTICATED_SESSION)
    return isinstance(at, int | float) and 0 <= time.time() - at <= settings.SSO_REAUTHENTICATE_S


def pending_sign_in(request: HttpRequest) -> tuple[User, dict] | None:
    """The user whose sign-in waits for its second factor in this session, and what it holds."""
    pending = request.session.get(PENDING_SESSION)
    if (
        not isinstance(pending, dict)
        or not isinstance(pending.get("user"), int)
        or time.time() - pending.get("at", 0) > PENDING_S
    ):
        request.session.pop(PENDING_SESSION, None)
        return None
    user = User.objects.filter(id=pending["user"], is_active=True).first()
    return (user, pending) if user is not None else None


def sign_in_finish(request: HttpRequest, user: User, pending: dict) -> None:
    """The second factor passed: the session is signed in (and, after a provider, remembers it)."""
    request.session.pop(PENDING_SESSION, None)
    request.session.pop(SETUP_SESSION, None)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    if isinstance(pending.get("sso"), str):
        request.session[SSO_SIGNED_IN_SESSION] = pending["sso"]
        request.session[SSO_REAUTHENTICATED_SESSION] = time.time()
