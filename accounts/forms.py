from __future__ import annotations

import datetime as dt
import re

from django import forms
from django.contrib.auth.forms import UserCreationForm

from accounts.models import ApiKey, User

MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


class SignupForm(UserCreationForm):
    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Something to recognise it by, e.g. “laptop script”.")
    scopes = forms.MultipleChoiceField(
        choices=ApiKey.Scope.choices, widget=forms.CheckboxSelectMultiple, initial=[ApiKey.Scope.CHAT]
    )
    expires_on = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="Optional. The key works through this day (UTC).",
    )

    def expires_at(self) -> dt.datetime | None:
        day = self.cleaned_data.get("expires_on")
        if day is None:
            return None
        return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC) + dt.timedelta(days=1)


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
