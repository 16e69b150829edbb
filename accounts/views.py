from __future__ import annotations

import io
import time
import zipfile
from pathlib import PurePosixPath

import pyotp
import segno
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from accounts.authentication import AuthenticatedHttpRequest
from accounts.forms import (
    AccountDeleteForm,
    ApiKeyCreateForm,
    PasswordConfirmForm,
    PasswordResetForm,
    SignupForm,
    ThrottledAuthenticationForm,
    UserSettingsForm,
)
from accounts.hooks import account_export_files
from accounts.metering import ADMITTED, metered
from accounts.models import User
from accounts.oidc import form_action_allow, provider_list, providers_linked_to
from accounts.selectors import (
    api_key_list_for_user,
    deployments_enabled_for_user,
    linked_identities_list,
    passkeys_list,
    password_sign_in_allowed,
    recovery_codes_left,
    second_factor_enabled,
    second_factor_required,
    totp_enabled,
    user_sessions_list,
    user_settings_get,
)
from accounts.services import (
    action_admit,
    api_key_create,
    api_key_revoke,
    email_verification_send,
    email_verify,
    login_attempt_admit,
    login_attempt_succeeded,
    password_reset_admit,
    second_factor_verify,
    sign_in_changed_notify,
    signup_admit,
    totp_device_confirm,
    totp_device_remove,
    totp_secret_new,
    user_create,
    user_delete,
    user_sessions_end_others,
    user_settings_update,
)
from accounts.sessions import (
    PENDING_SESSION,
    SETUP_SESSION,
    pending_sign_in,
    reauthenticated_recently,
    sign_in_finish,
)
from chatsite.errors import ClientError


def _sign_in_choices() -> dict:
    """The providers' buttons, and whether passwords are on, for the sign-in and sign-up pages."""
    return {"providers": provider_list(), "passwords_on": settings.PASSWORD_SIGN_IN == "on"}


@metered("request")
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("conversations:chat")
    if settings.PASSWORD_SIGN_IN == "off":
        # Accounts come from the identity provider: its first sign-in makes one.
        choices = _sign_in_choices()
        return form_action_allow(render(request, "accounts/signup.html", choices, status=403), choices["providers"])
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            # Counted only for an account about to be made: a form with a typo costs nothing.
            signup_admit(address=request.META.get("REMOTE_ADDR", ""))
        except ClientError as exc:
            form.add_error(None, exc.message)
            choices = _sign_in_choices()
            response = render(request, "accounts/signup.html", {"form": form} | choices, status=exc.status)
            response["Retry-After"] = str(exc.retry_after)
            return form_action_allow(response, choices["providers"])
        user = user_create(
            username=form.cleaned_data["username"],
            email=form.cleaned_data.get("email", ""),
            password=form.cleaned_data["password1"],
        )
        if user.email:
            _verification_send(request, user)
        if settings.EMAIL_VERIFICATION == "required":
            return render(request, "accounts/verify_email.html", {"email": user.email, "sent": True})
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("conversations:chat")
    choices = _sign_in_choices()
    return form_action_allow(render(request, "accounts/signup.html", {"form": form} | choices), choices["providers"])


# --- verifying an email address -------------------------------------------------------------------

UNVERIFIED_SESSION = "accounts.unverified_user"


def _verification_send(request: HttpRequest, user: User) -> ClientError | None:
    """Send the verification link; a refusal (too many lately) is returned, not raised."""
    try:
        email_verification_send(
            user=user, link_for=lambda token: request.build_absolute_uri(reverse("accounts:email_verify", args=[token]))
        )
    except ClientError as exc:
        return exc
    return None


@metered("request")
@never_cache
@require_http_methods(["GET"])
def email_verify_view(request: HttpRequest, token: str) -> HttpResponse:
    user = email_verify(token=token)
    if user is None:
        return render(request, "accounts/verify_email.html", {"invalid": True}, status=400)
    return render(request, "accounts/verify_email.html", {"verified": True, "email": user.email})


@metered("request")
@require_POST
def email_verification_resend_view(request: HttpRequest) -> HttpResponse:
    """Send the link again: for the signed-in user, or for the one whose sign-in waits for it (the
    session says who; nothing here takes a username or an address)."""
    user: User | None = request.user if request.user.is_authenticated else None
    if user is None:
        user_id = request.session.get(UNVERIFIED_SESSION)
        user = User.objects.filter(id=user_id).first() if isinstance(user_id, int) else None
    if user is None or not user.email:
        return redirect("accounts:login")
    refused = _verification_send(request, user)
    context = {"email": user.email, "sent": refused is None, "error": refused.message if refused else ""}
    response = render(request, "accounts/verify_email.html", context, status=refused.status if refused else 200)
    if refused is not None:
        response["Retry-After"] = str(refused.retry_after)
    return response


@metered("request")
class LoginView(auth_views.LoginView):
    """Django's sign-in page with its attempts throttled (ThrottledAuthenticationForm)."""

    template_name = "accounts/login.html"
    redirect_authenticated_user = True
    authentication_form = ThrottledAuthenticationForm

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        """The password is right. With a second factor on (or required of this user), the sign-in
        waits for it (`two_factor_view`); the session is not signed in until then."""
        user = form.get_user()
        if not password_sign_in_allowed(user=user):
            form.add_error(None, "Passwords are turned off here. Sign in with your organisation's account below.")
            return self.render_to_response(self.get_context_data(form=form), status=403)
        if settings.EMAIL_VERIFICATION == "required" and not user.email_verified:
            self.request.session[UNVERIFIED_SESSION] = user.pk
            return render(self.request, "accounts/verify_email.html", {"email": user.email, "needed": True}, status=403)
        if second_factor_enabled(user=user) or second_factor_required(user=user):
            self.request.session.cycle_key()
            self.request.session[PENDING_SESSION] = {
                "user": user.pk,
                "at": time.time(),
                "next": self.get_success_url(),
            }
            return redirect("accounts:two_factor")
        return super().form_valid(form)

    def get_context_data(self, **kwargs):
        return super().get_context_data(**kwargs) | _sign_in_choices()

    def render_to_response(self, context, **kwargs):
        return form_action_allow(super().render_to_response(context, **kwargs), context.get("providers", []))

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        if isinstance(form, ThrottledAuthenticationForm) and form.locked is not None:
            response.status_code = 429
            response["Retry-After"] = str(form.locked.retry_after)
        return response


# --- the second factor ----------------------------------------------------------------------------


def _qr_svg(user: User, secret: str) -> str:
    """The authenticator app's QR code, as inline SVG markup made here from the secret (no image
    request, no script; nothing in it comes from the user but their URL-encoded name)."""
    uri = pyotp.TOTP(secret).provisioning_uri(name=user.get_username(), issuer_name=TOTP_ISSUER)
    return segno.make(uri, error="m").svg_inline(scale=4, border=2, dark="#000", light="#fff")


TOTP_ISSUER = "Chat"


def _setup_context(request: HttpRequest, user: User) -> dict:
    secret = request.session.get(SETUP_SESSION)
    if not isinstance(secret, str):
        secret = totp_secret_new()
        request.session[SETUP_SESSION] = secret
    return {"qr": mark_safe(_qr_svg(user, secret)), "secret": secret}  # noqa: S308 - segno's own markup


@metered("request")
@never_cache
@require_http_methods(["GET", "POST"])
def two_factor_view(request: HttpRequest) -> HttpResponse:
    """The second step of a sign-in: a code from the authenticator app, or a recovery code. A user
    the operator requires a second factor of, and who has none yet, sets it up here first."""
    found = pending_sign_in(request)
    if found is None:
        return redirect("accounts:login")
    user, pending = found
    address = request.META.get("REMOTE_ADDR", "")
    enabled = second_factor_enabled(user=user)
    code = request.POST.get("code", "") if request.method == "POST" else ""
    choices = {"totp": totp_enabled(user=user), "passkeys": passkeys_list(user=user).exists()}
    error, status = "", 200
    if request.method == "POST":
        try:
            charges = login_attempt_admit(username=user.get_username(), address=address)
        except ClientError as exc:
            response = render(
                request, "accounts/two_factor.html", {"error": exc.message, "enabled": enabled} | choices, status=429
            )
            response["Retry-After"] = str(exc.retry_after)
            return response
        if enabled:
            if second_factor_verify(user=user, code=code):
                login_attempt_succeeded(charges=charges)
                sign_in_finish(request, user, pending)
                return redirect(pending.get("next") or "conversations:chat")
            error, status = "That code does not work. Try the newest one, or a recovery code.", 400
        else:
            try:
                codes = totp_device_confirm(user=user, secret=str(request.session.get(SETUP_SESSION, "")), code=code)
            except ClientError as exc:
                error, status = exc.message, exc.status
            else:
                login_attempt_succeeded(charges=charges)
                sign_in_finish(request, user, pending)
                return render(request, "accounts/recovery_codes.html", {"codes": codes, "next": pending.get("next")})
    context = {"enabled": enabled, "error": error} | choices
    if not enabled:
        context |= _setup_context(request, user)
    return render(request, "accounts/two_factor.html", context, status=status)


@metered("request")
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def two_factor_setup_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Turn on the second factor from the settings page: scan the QR code, type the code the app
    shows; the recovery codes are shown once."""
    error, status = "", 200
    if request.method == "POST":
        try:
            codes = totp_device_confirm(
                user=request.user, secret=str(request.session.get(SETUP_SESSION, "")), code=request.POST.get("code", "")
            )
        except ClientError as exc:
            error, status = exc.message, exc.status
        else:
            request.session.pop(SETUP_SESSION, None)
            return render(
                request, "accounts/recovery_codes.html", {"codes": codes, "next": reverse("accounts:settings")}
            )
    context = {"error": error, "setup": True} | _setup_context(request, request.user)
    return render(request, "accounts/two_factor_setup.html", context, status=status)


@metered("request")
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def two_factor_disable_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Turn the second factor off, after the password (throttled as a sign-in is). Refused where the
    operator requires it of this user."""
    if second_factor_required(user=request.user):
        return render(request, "accounts/two_factor_disable.html", {"required": True}, status=403)
    form = PasswordConfirmForm(
        request.POST or None,
        user=request.user,
        address=request.META.get("REMOTE_ADDR", ""),
        reauthenticated=reauthenticated_recently(request),
    )
    if request.method == "POST" and form.is_valid():
        totp_device_remove(user=request.user)
        messages.success(request, "Two-factor sign-in is off.")
        return redirect("accounts:settings")
    status = 200 if request.method == "GET" else (form.locked.status if form.locked is not None else 400)
    providers = providers_linked_to(user=request.user)
    response = render(
        request, "accounts/two_factor_disable.html", {"form": form, "providers": providers}, status=status
    )
    return form_action_allow(response, providers)


# --- passwords: reset by email, and change -------------------------------------------------------


@metered("request")
class PasswordResetView(auth_views.PasswordResetView):
    """Django's reset: one email with a one-time, expiring link (settings.PASSWORD_RESET_TIMEOUT), and
    the same page after, whether or not an account has that address. Throttled per client address
    and per email address (accounts.services.password_reset_admit)."""

    template_name = "accounts/password_reset.html"
    form_class = PasswordResetForm
    email_template_name = "accounts/password_reset_email.txt"
    subject_template_name = "accounts/password_reset_subject.txt"
    success_url = reverse_lazy("accounts:password_reset_done")

    def form_valid(self, form):
        try:
            password_reset_admit(address=self.request.META.get("REMOTE_ADDR", ""), email=form.cleaned_data["email"])
        except ClientError as exc:
            form.add_error(None, exc.message)
            response = self.render_to_response(self.get_context_data(form=form), status=exc.status)
            response["Retry-After"] = str(exc.retry_after)
            return response
        return super().form_valid(form)


@metered("request")
class PasswordResetDoneView(auth_views.PasswordResetDoneView):
    template_name = "accounts/password_reset_done.html"


@metered("request")
class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    """The link's page: a new password, once; the link then stops working (its token signs the old
    hash). Every session signed in with the old password ends, its sockets close, and the account's
    email is told."""

    template_name = "accounts/password_reset_confirm.html"
    success_url = reverse_lazy("accounts:password_reset_complete")

    def form_valid(self, form):
        response = super().form_valid(form)
        sign_in_changed_notify(user=form.user, how="with a reset link")
        return response


@metered("request")
class PasswordResetCompleteView(auth_views.PasswordResetCompleteView):
    template_name = "accounts/password_reset_complete.html"


@metered("request")
class PasswordChangeView(auth_views.PasswordChangeView):
    """A signed-in person's new password, after the current one; this session stays signed in, the
    others end (Django keeps this one's hash current)."""

    template_name = "accounts/password_change.html"
    success_url = reverse_lazy("accounts:settings")

    def dispatch(self, request, *args, **kwargs):
        if request.user.is_authenticated and not password_sign_in_allowed(user=request.user):
            return render(request, "accounts/password_change.html", {"passwords_off": True}, status=403)
        return super().dispatch(request, *args, **kwargs)

    def form_valid(self, form):
        response = super().form_valid(form)
        sign_in_changed_notify(user=form.user, how="from the settings page")
        messages.success(self.request, "Password changed. Other places you were signed in are signed out.")
        return response


CREATED_KEY_SESSION = "accounts.created_api_key"


@metered("request", POST=ADMITTED)
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def api_keys(request: AuthenticatedHttpRequest) -> HttpResponse:
    """List the user's keys and create one. A created key redirects back here (a reload does not
    create a second one); its full value waits in the session for that one page, then is gone.

    Creating one counts against the plan's keys a day (a valid form only: a typo costs nothing)."""
    form = ApiKeyCreateForm(request.POST or None)
    status = 200
    retry_after = None
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                action_admit(user=request.user, action="api_key")
                created = api_key_create(
                    user=request.user,
                    name=form.cleaned_data["name"],
                    scopes=form.cleaned_data["scopes"],
                    expires_at=form.expires_at(),
                    requests_per_minute=form.cleaned_data.get("requests_per_minute"),
                    tokens_per_minute=form.cleaned_data.get("tokens_per_minute"),
                )
            except ClientError as exc:
                form.add_error(None, exc.message)
                status, retry_after = exc.status, exc.retry_after
            else:
                request.session[CREATED_KEY_SESSION] = {"name": created.api_key.name, "key": created.key}
                return redirect("accounts:api_keys")
    # Shown once: taken out of the session by the page that shows it.
    shown = request.session.pop(CREATED_KEY_SESSION, None) if request.method == "GET" else None
    response = render(
        request,
        "accounts/api_keys.html",
        {"form": form, "created": shown, "keys": api_key_list_for_user(user=request.user), "now": timezone.now()},
        status=status,
    )
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


@metered("request")
@login_required
@require_POST
def api_key_revoke_view(request: AuthenticatedHttpRequest, api_key_id: int) -> HttpResponse:
    try:
        api_key = api_key_revoke(user=request.user, api_key_id=api_key_id)
    except ClientError as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
    messages.success(request, f"Revoked “{api_key.name}”. It no longer works.")
    return redirect("accounts:api_keys")


@metered("request")
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def settings_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The person's custom instructions, default model and theme. Saved, it redirects (a reload
    does not post again) and says so once."""
    allowed = deployments_enabled_for_user(user=request.user)
    current = user_settings_get(user=request.user)
    initial = {
        "about_me": current.about_me,
        "answer_style": current.answer_style,
        "default_model": current.default_model,
        "theme": current.theme,
    }
    # The public model names (deployments sharing one split its traffic: orchestration.routing).
    models = sorted({d.public_model: d.label for d in allowed}.items())
    form = UserSettingsForm(request.POST or None, initial=initial, models=models)
    if request.method == "POST" and form.is_valid():
        try:
            user_settings_update(user=request.user, allowed_models={name for name, _ in models}, **form.cleaned_data)
        except ClientError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, "Settings saved.")
            return redirect("accounts:settings")
    status = 400 if request.method == "POST" else 200
    context = {
        "form": form,
        "sessions": user_sessions_list(user=request.user),
        "two_factor": totp_enabled(user=request.user),
        "passkeys": passkeys_list(user=request.user),
        "two_factor_required": second_factor_required(user=request.user),
        "recovery_codes_left": recovery_codes_left(user=request.user),
        "linked": linked_identities_list(user=request.user),
        "passwords_allowed": password_sign_in_allowed(user=request.user),
    }
    return render(request, "accounts/settings.html", context, status=status)


# --- your data: where you are signed in, the archive, leaving --------------------------------------


@metered("request")
@login_required
@require_POST
def sessions_end_others_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    ended = user_sessions_end_others(user=request.user, keep_session_key=request.session.session_key or "")
    messages.success(request, f"Signed out of {ended} other session{'' if ended == 1 else 's'}.")
    return redirect("accounts:settings")


ARCHIVE_README = """Everything this service holds about your account, as of {when} (UTC).

account.json       your account, settings, API keys (names only: a key's secret is never stored)
                   and where you are signed in
conversations/     each conversation with every branch (JSON; "parent" links each message to the
                   one it follows)
files/             each file you uploaded, as uploaded; files.json says what each is
usage.csv          every request's tokens and cost
"""


@metered("request")
@never_cache
@login_required
@require_http_methods(["GET"])
def account_export_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The person's data as one ZIP archive: what each app holds about them (accounts.hooks)."""
    now = timezone.now()
    archive = io.BytesIO()  # the apps' files are in memory already: each plan bounds what a person stores
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("README.txt", ARCHIVE_README.format(when=now.strftime("%Y-%m-%d %H:%M")))
        for path, data in sorted(account_export_files(user=request.user).items()):
            parts = PurePosixPath(path).parts
            if PurePosixPath(path).is_absolute() or ".." in parts or not parts:
                raise ValueError(f"an export path leaves the archive: {path!r}")
            zipped.writestr(path, data)
    response = HttpResponse(archive.getvalue(), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{request.user.username}-data-{now:%Y-%m-%d}.zip"'
    return response


@metered("request")
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def account_delete_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Delete the account, after its password and a tick; it cannot be undone (accounts.services.user_delete)."""
    form = AccountDeleteForm(
        request.POST or None,
        user=request.user,
        address=request.META.get("REMOTE_ADDR", ""),
        reauthenticated=reauthenticated_recently(request),
    )
    if request.method == "POST" and form.is_valid():
        username = request.user.username
        user_delete(user=request.user)
        request.session.flush()
        return render(request, "accounts/deleted.html", {"username": username})
    status = 200
    if request.method == "POST":
        status = form.locked.status if form.locked is not None else 400
    providers = providers_linked_to(user=request.user)
    response = render(request, "accounts/delete.html", {"form": form, "providers": providers}, status=status)
    form_action_allow(response, providers)
    if form.locked is not None:
        response["Retry-After"] = str(form.locked.retry_after)
    return response
