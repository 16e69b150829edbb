from __future__ import annotations

import datetime as dt
import re
from typing import cast

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm
from django.contrib.auth.forms import PasswordResetForm as DjangoPasswordResetForm

from accounts.models import ApiKey, User, UserSettings
from accounts.selectors import password_sign_in_allowed
from accounts.services import login_attempt_admit, login_attempt_succeeded
from chatsite.errors import ClientError

MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


class SignupForm(UserCreationForm):
    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Where the operator requires a verified address, an account needs one to verify.
        self.fields["email"].required = settings.EMAIL_VERIFICATION == "required"


class ThrottledAuthenticationForm(AuthenticationForm):
    """Django's sign-in form, its attempts throttled per account and per client address
    (accounts.services.login_attempt_admit): a locked attempt is refused before the password is
    checked, and only failures count. `locked` holds the refusal, for the page's status."""

    locked: ClientError | None = None

    def clean(self):
        username, password = self.cleaned_data.get("username"), self.cleaned_data.get("password")
        if username is None or not password:
            return super().clean()
        try:
            # The client's address, behind a proxy the operator named too (chatsite.proxies).
            address = self.request.META.get("REMOTE_ADDR", "") if self.request is not None else ""
            charges = login_attempt_admit(username=username, address=address)
        except ClientError as exc:
            self.locked = exc
            raise forms.ValidationError(exc.message, code=exc.code) from None
        cleaned = super().clean()  # a wrong password raises here, and its attempt stays counted
        login_attempt_succeeded(charges=charges)
        return cleaned


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Something to recognise it by, e.g. “laptop script”.")
    scopes = forms.MultipleChoiceField(
        choices=ApiKey.Scope.choices, widget=forms.CheckboxSelectMultiple, initial=list(ApiKey.DEFAULT_SCOPES)
    )
    expires_on = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="Optional. The key works through this day (UTC).",
    )
    requests_per_minute = forms.IntegerField(
        required=False, min_value=1, max_value=2**31 - 1, help_text="Optional: a cap below your plan's, for this key."
    )
    tokens_per_minute = forms.IntegerField(
        required=False, min_value=1, max_value=2**31 - 1, help_text="Optional: a cap below your plan's, for this key."
    )

    def expires_at(self) -> dt.datetime | None:
        day = self.cleaned_data.get("expires_on")
        if day is None:
            return None
        return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC) + dt.timedelta(days=1)


class UserSettingsForm(forms.Form):
    about_me = forms.CharField(
        required=False,
        max_length=UserSettings.ABOUT_MAX_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 4}),
        label="What should the model know about you?",
        help_text=f"Up to {UserSettings.ABOUT_MAX_CHARS} characters. Goes into every chat's instructions.",
    )
    answer_style = forms.CharField(
        required=False,
        max_length=UserSettings.STYLE_MAX_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 4}),
        label="How should it answer?",
        help_text=f"Up to {UserSettings.STYLE_MAX_CHARS} characters, e.g. “briefly, in British English”.",
    )
    default_model = forms.ChoiceField(label="Default model for new chats")
    theme = forms.ChoiceField(choices=UserSettings.Theme.choices, widget=forms.RadioSelect, label="Theme")

    def __init__(self, *args, models: list[tuple[str, str]], **kwargs) -> None:
        """`models`: (name, label) of the deployments the person's plan may use now."""
        super().__init__(*args, **kwargs)
        default_model = cast(forms.ChoiceField, self.fields["default_model"])
        default_model.choices = [("", "The service's default"), *models]
        self.fields["default_model"].required = False

    def clean_about_me(self) -> str:
        return _no_nul(self.cleaned_data["about_me"])

    def clean_answer_style(self) -> str:
        return _no_nul(self.cleaned_data["answer_style"])


def _no_nul(text: str) -> str:
    # PostgreSQL refuses NUL in text outright: a clear error here, not a 500 on save.
    if "\x00" in text:
        raise forms.ValidationError("Text cannot contain NUL characters.")
    return text


def parse_month(value: str | None, *, today: dt.date) -> dt.date:
    """`YYYY-MM` as the first day of that month; the current month when absent. ValueError on nonsense."""
    if value is None or value == "":
        return today.replace(day=1)
    match = MONTH_RE.match(value)
    if not match:
        raise ValueError("month must look like 2026-11")
    year, month = int(match.group(1)), int(match.group(2))
    if not (2000 <= year <= 9998 and 1 <= month <= 12):
        raise ValueError("month is out of range")
    return dt.date(year, month, 1)


class PasswordResetForm(DjangoPasswordResetForm):
    """Django's reset form, which sends nothing to an account that may not sign in with a password
    (PASSWORD_SIGN_IN=off): the page reads the same either way."""

    def get_users(self, email):
        return (user for user in super().get_users(email) if password_sign_in_allowed(user=user))


class PasswordConfirmForm(forms.Form):
    """An action that asks for the account's password again, throttled as a sign-in is (a stolen
    session must not be able to guess it). An account without a password (made by an identity
    provider) proves itself by a recent sign-in there instead (`reauthenticated`)."""

    password = forms.CharField(widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))

    locked: ClientError | None = None

    def __init__(self, *args, user: User, address: str, reauthenticated: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.address = address
        self.reauthenticated = reauthenticated
        self.needs_provider = not user.has_usable_password()
        if self.needs_provider:
            del self.fields["password"]

    def clean(self):
        cleaned = super().clean()
        if self.needs_provider and not self.reauthenticated:
            raise forms.ValidationError(
                "Sign in again with your provider to confirm it is you, then come back.", code="reauthenticate"
            )
        return cleaned

    def clean_password(self) -> str:
        password = self.cleaned_data["password"]
        try:
            charges = login_attempt_admit(username=self.user.username, address=self.address)
        except ClientError as exc:
            self.locked = exc
            raise forms.ValidationError(exc.message, code=exc.code) from None
        if not self.user.check_password(password):
            raise forms.ValidationError("That is not your password.", code="invalid_password")
        login_attempt_succeeded(charges=charges)
        return password


class AccountDeleteForm(PasswordConfirmForm):
    """Deleting an account asks for its password and for a tick that says the person knows it cannot
    be undone."""

    understood = forms.BooleanField(
        label="I understand that my conversations, files, keys and settings are deleted for good."
    )
