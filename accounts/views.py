from __future__ import annotations

import io
import zipfile
from pathlib import PurePosixPath

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from accounts.authentication import AuthenticatedHttpRequest
from accounts.forms import (
    AccountDeleteForm,
    ApiKeyCreateForm,
    SignupForm,
    ThrottledAuthenticationForm,
    UserSettingsForm,
)
from accounts.hooks import account_export_files
from accounts.metering import ADMITTED, metered
from accounts.selectors import (
    api_key_list_for_user,
    deployments_enabled_for_user,
    user_sessions_list,
    user_settings_get,
)
from accounts.services import (
    action_admit,
    api_key_create,
    api_key_revoke,
    password_changed_notify,
    password_reset_admit,
    signup_admit,
    user_create,
    user_delete,
    user_sessions_end_others,
    user_settings_update,
)
from chatsite.errors import ClientError


@metered("request")
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("conversations:chat")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            # Counted only for an account about to be made: a form with a typo costs nothing.
            signup_admit(address=request.META.get("REMOTE_ADDR", ""))
        except ClientError as exc:
            form.add_error(None, exc.message)
            response = render(request, "accounts/signup.html", {"form": form}, status=exc.status)
            response["Retry-After"] = str(exc.retry_after)
            return response
        user = user_create(
            username=form.cleaned_data["username"],
            email=form.cleaned_data.get("email", ""),
            password=form.cleaned_data["password1"],
        )
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("conversations:chat")
    return render(request, "accounts/signup.html", {"form": form})


@metered("request")
class LoginView(auth_views.LoginView):
    """Django's sign-in page with its attempts throttled (ThrottledAuthenticationForm)."""

    template_name = "accounts/login.html"
    redirect_authenticated_user = True
    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        if isinstance(form, ThrottledAuthenticationForm) and form.locked is not None:
            response.status_code = 429
            response["Retry-After"] = str(form.locked.retry_after)
        return response


# --- passwords: reset by email, and change -------------------------------------------------------


@metered("request")
class PasswordResetView(auth_views.PasswordResetView):
    """Django's reset: one email with a one-time, expiring link (settings.PASSWORD_RESET_TIMEOUT), and
    the same page after, whether or not an account has that address. Throttled per client address
    and per email address (accounts.services.password_reset_admit)."""

    template_name = "accounts/password_reset.html"
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
        password_changed_notify(user=form.user, how="with a reset link")
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

    def form_valid(self, form):
        response = super().form_valid(form)
        password_changed_notify(user=form.user, how="from the settings page")
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
    context = {"form": form, "sessions": user_sessions_list(user=request.user)}
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
    form = AccountDeleteForm(request.POST or None, user=request.user, address=request.META.get("REMOTE_ADDR", ""))
    if request.method == "POST" and form.is_valid():
        username = request.user.username
        user_delete(user=request.user)
        request.session.flush()
        return render(request, "accounts/deleted.html", {"username": username})
    status = 200
    if request.method == "POST":
        status = form.locked.status if form.locked is not None else 400
    response = render(request, "accounts/delete.html", {"form": form}, status=status)
    if form.locked is not None:
        response["Retry-After"] = str(form.locked.retry_after)
    return response
