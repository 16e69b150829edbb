"""Passkeys' endpoints: the settings page registers and removes them; the sign-in's second step,
and the sign-in page alone, use them (static/accounts/passkeys.js calls the JSON ones, with the
page's CSRF token)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from accounts.authentication import AuthenticatedHttpRequest
from accounts.forms import PasswordConfirmForm
from accounts.metering import metered
from accounts.oidc import form_action_allow, providers_linked_to
from accounts.passkeys import (
    passkey_authenticate,
    passkey_authentication_options,
    passkey_of_user,
    passkey_register,
    passkey_registration_options,
    passkey_remove,
)
from accounts.services import login_attempt_admit, login_attempt_succeeded
from accounts.sessions import pending_sign_in, reauthenticated_recently, sign_in_finish
from chatsite.errors import ClientError, request_too_large

CREDENTIAL_MAX_BYTES = 64 * 1024


def _error(exc: ClientError) -> JsonResponse:
    response = JsonResponse({"error": {"message": exc.message, "code": exc.code}}, status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


@dataclass(frozen=True)
class PasskeyAnswer:
    """A browser's answer (navigator.credentials' credential, as JSON) and, registering, its name."""

    credential: dict[str, Any]
    name: str


def _parse(request: HttpRequest) -> PasskeyAnswer:
    try:
        if len(request.body) > CREDENTIAL_MAX_BYTES:
            raise request_too_large()
        body = json.loads(request.body)
    except RequestDataTooBig:
        raise request_too_large() from None
    except (ValueError, UnicodeDecodeError):
        raise ClientError("The body must be JSON.", code="invalid_json") from None
    if not isinstance(body, dict) or not isinstance(body.get("credential"), dict):
        raise ClientError("The body needs a credential object.", code="invalid_credential", param="credential")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise ClientError("name must be a string.", code="invalid_name", param="name")
    return PasskeyAnswer(credential=body["credential"], name=name)


# --- the settings page: register, remove ------------------------------------------------------------


@metered("request")
@never_cache
@login_required
@require_POST
def passkey_register_options_view(request: AuthenticatedHttpRequest) -> JsonResponse:
    return JsonResponse(passkey_registration_options(request=request, user=request.user))


@metered("request")
@never_cache
@login_required
@require_POST
def passkey_register_view(request: AuthenticatedHttpRequest) -> JsonResponse:
    try:
        answer = _parse(request)
        passkey = passkey_register(request=request, user=request.user, name=answer.name, credential=answer.credential)
    except ClientError as exc:
        return _error(exc)
    messages.success(request, f"Passkey “{passkey.name}” added.")
    return JsonResponse({"id": passkey.id, "name": passkey.name, "redirect": reverse("accounts:settings")}, status=201)


@metered("request")
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def passkey_remove_view(request: AuthenticatedHttpRequest, passkey_id: int) -> HttpResponse:
    """Remove a passkey, after the password (or, for an account without one, a fresh sign-in with
    its provider), throttled as a sign-in is. Another person's passkey is a 404."""
    try:
        passkey = passkey_of_user(user=request.user, passkey_id=passkey_id)
    except ClientError as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
    form = PasswordConfirmForm(
        request.POST or None,
        user=request.user,
        address=request.META.get("REMOTE_ADDR", ""),
        reauthenticated=reauthenticated_recently(request),
    )
    if request.method == "POST" and form.is_valid():
        passkey_remove(user=request.user, passkey_id=passkey.id)
        messages.success(request, f"Passkey “{passkey.name}” removed.")
        return redirect("accounts:settings")
    status = 200 if request.method == "GET" else (form.locked.status if form.locked is not None else 400)
    providers = providers_linked_to(user=request.user)
    context = {"form": form, "passkey": passkey, "providers": providers}
    response = render(request, "accounts/passkey_remove.html", context, status=status)
    if form.locked is not None:
        response["Retry-After"] = str(form.locked.retry_after)
    return form_action_allow(response, providers)


# --- signing in: the second step, or a passkey alone -----------------------------------------------


@metered("request")
@never_cache
@require_POST
def passkey_second_factor_options_view(request: HttpRequest) -> JsonResponse:
    found = pending_sign_in(request)
    if found is None:
        return _error(ClientError("Sign in again: that sign-in expired.", code="no_sign_in", status=401))
    return JsonResponse(passkey_authentication_options(request=request, user=found[0]))


@metered("request")
@never_cache
@require_POST
def passkey_second_factor_view(request: HttpRequest) -> JsonResponse:
    """The second step with one of the pending user's passkeys; counted as a code is, per account
    and per address (only failures stay counted)."""
    found = pending_sign_in(request)
    if found is None:
        return _error(ClientError("Sign in again: that sign-in expired.", code="no_sign_in", status=401))
    user, pending = found
    try:
        charges = login_attempt_admit(username=user.get_username(), address=request.META.get("REMOTE_ADDR", ""))
        answer = _parse(request)
        passkey_authenticate(request=request, user=user, credential=answer.credential)
    except ClientError as exc:
        return _error(exc)
    login_attempt_succeeded(charges=charges)
    sign_in_finish(request, user, pending)
    return JsonResponse({"redirect": pending.get("next") or reverse("conversations:chat")})


@metered("request")
@never_cache
@require_POST
def passkey_sign_in_options_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(passkey_authentication_options(request=request, user=None))


@metered("request")
@never_cache
@require_POST
def passkey_sign_in_view(request: HttpRequest) -> JsonResponse:
    """Signing in with a passkey alone: it must verify the person (a PIN, a fingerprint), which
    makes it two factors in one. Throttled per address, then per account once it is known."""
    address = request.META.get("REMOTE_ADDR", "")
    try:
        charges = login_attempt_admit(username=None, address=address)
        answer = _parse(request)
        passkey = passkey_authenticate(request=request, user=None, credential=answer.credential)
        user = passkey.user
        if not user.is_active:
            raise ClientError("This account is disabled.", code="account_disabled", status=403)
        charges += login_attempt_admit(username=user.get_username(), address=None)
    except ClientError as exc:
        return _error(exc)
    login_attempt_succeeded(charges=charges)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return JsonResponse({"redirect": reverse("conversations:chat")})
