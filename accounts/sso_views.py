"""Signing in through an identity provider: the button's POST starts the flow (`sso_start_view`),
the provider sends the browser back to `sso_callback_view`, which signs in, starts the second step
when the account has a second factor, or refreshes a signed-in person's proof of who they are
(before deleting an account that has no password)."""

from __future__ import annotations

import time

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from accounts.authentication import AuthenticatedHttpRequest
from accounts.identity import linked_identity_remove, sso_user_resolve
from accounts.metering import metered
from accounts.oidc import Provider, authorization_finish, authorization_redirect, provider_get
from accounts.selectors import second_factor_enabled, second_factor_required
from accounts.services import login_attempt_admit, login_attempt_succeeded
from accounts.sessions import (
    PENDING_SESSION,
    SSO_REAUTHENTICATED_SESSION,
    SSO_SIGNED_IN_SESSION,
)
from chatsite.errors import ClientError

# What the flow the browser is away on was started for: where to go after, and whether it only
# refreshes a signed-in person's proof of who they are.
FLOW_SESSION = "accounts.sso_flow"


def _provider_or_404(slug: str) -> Provider:
    provider = provider_get(slug=slug) if len(slug) <= 32 else None
    if provider is None:
        raise Http404("No such sign-in provider.")
    return provider


def _safe_next(request: HttpRequest, value: str) -> str:
    if value and url_has_allowed_host_and_scheme(
        value, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return value
    return ""


def _refusal(request: HttpRequest, exc: ClientError, provider: Provider | None = None) -> HttpResponse:
    context = {"error": exc.message, "provider": provider}
    response = render(request, "accounts/sso_error.html", context, status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


@metered("request")
@never_cache
@require_POST
def sso_start_view(request: HttpRequest, slug: str) -> HttpResponse:
    """Send the browser to the provider's sign-in page. `next`: where to land after (this site
    only). `reauthenticate` (signed in): the provider is asked to sign the person in again."""
    provider = _provider_or_404(slug)
    reauthenticate = request.user.is_authenticated and request.POST.get("reauthenticate") == "1"
    if request.user.is_authenticated and not reauthenticate:
        return redirect("conversations:chat")
    params = {"prompt": "login", "max_age": "0"} if reauthenticate and provider.is_oidc else {}
    redirect_uri = request.build_absolute_uri(reverse("accounts:sso_callback", args=[provider.slug]))
    try:
        response = authorization_redirect(request=request, provider=provider, redirect_uri=redirect_uri, **params)
    except ClientError as exc:
        return _refusal(request, exc, provider)
    request.session[FLOW_SESSION] = {
        "next": _safe_next(request, request.POST.get("next", "")),
        "reauthenticate": request.user.pk if reauthenticate else None,
    }
    return response


@metered("request")
@never_cache
@require_GET
def sso_callback_view(request: HttpRequest, slug: str) -> HttpResponse:
    """Where the provider sends the browser back. Throttled as a password sign-in is: the address's
    bucket before anything is checked, the account's once it is known (a locked account is locked
    here too); only failures count."""
    provider = _provider_or_404(slug)
    address = request.META.get("REMOTE_ADDR", "")
    flow = request.session.pop(FLOW_SESSION, None)
    flow = flow if isinstance(flow, dict) else {}
    try:
        charges = login_attempt_admit(username=None, address=address)
        identity = authorization_finish(request=request, provider=provider)
        user = sso_user_resolve(provider=provider, identity=identity, address=address)
        charges += login_attempt_admit(username=user.get_username(), address=None)
    except ClientError as exc:
        return _refusal(request, exc, provider)
    login_attempt_succeeded(charges=charges)
    next_url = flow.get("next") or reverse("conversations:chat")
    if flow.get("reauthenticate") is not None:
        if not request.user.is_authenticated or request.user.pk != user.pk or flow["reauthenticate"] != user.pk:
            return _refusal(
                request,
                ClientError(f"{provider.display_name} signed in someone else.", code="sso_other_user", status=403),
                provider,
            )
        request.session[SSO_REAUTHENTICATED_SESSION] = time.time()
        return redirect(next_url)
    if second_factor_enabled(user=user) or second_factor_required(user=user):
        request.session.cycle_key()
        request.session[PENDING_SESSION] = {"user": user.pk, "at": time.time(), "next": next_url, "sso": provider.slug}
        return redirect("accounts:two_factor")
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    request.session[SSO_SIGNED_IN_SESSION] = provider.slug
    request.session[SSO_REAUTHENTICATED_SESSION] = time.time()
    return redirect(next_url)


@metered("request")
@login_required
@require_POST
def linked_identity_remove_view(request: AuthenticatedHttpRequest, identity_id: int) -> HttpResponse:
    """Unlink one of the person's provider sign-ins from the settings page (another's is a 404; the
    account's only way in is refused with 409). The account's address is told."""
    try:
        removed = linked_identity_remove(user=request.user, identity_id=identity_id)
    except ClientError as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
    messages.success(request, f"Signing in with {removed.provider} is unlinked.")
    return redirect("accounts:settings")
