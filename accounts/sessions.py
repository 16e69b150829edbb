"""What the accounts pages keep in a person's session between requests, named in one place."""

from __future__ import annotations

import time

from django.conf import settings
from django.http import HttpRequest

# A sign-in whose first step passed (a password, a provider) and whose second factor is awaited, in
# the (not signed-in) session, for PENDING_S at most.
PENDING_SESSION = "accounts.second_factor_pending"
PENDING_S = 300
# The provider this session signed in through, and when the person last proved who they are there.
SSO_SIGNED_IN_SESSION = "accounts.sso_provider"
SSO_REAUTHENTICATED_SESSION = "accounts.sso_reauthenticated_at"


def reauthenticated_recently(request: HttpRequest) -> bool:
    """Whether this session signed in (or signed in again) through a provider within
    SSO_REAUTHENTICATE_S: what stands for the password of an account that has none."""
    at = request.session.get(SSO_REAUTHENTICATED_SESSION)
    return isinstance(at, int | float) and 0 <= time.time() - at <= settings.SSO_REAUTHENTICATE_S
