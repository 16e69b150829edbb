"""`manage.py createapikey USERNAME`: issue an API key and print it once, alone on stdout."""

from __future__ import annotations

import datetime as dt
import re

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from accounts.models import ApiKey
from accounts.services import api_key_create
from chatsite.errors import ClientError

DEFAULT_SCOPES = ",".join(ApiKey.DEFAULT_SCOPES)


def parse_expiry(value: str | None) -> dt.datetime | None:
    """`30d` (days from now) or an ISO date/datetime; a bare date means midnight UTC of that day."""
    if not value:
        return None
    if match := re.fullmatch(r"(\d{1,5})d", value.strip()):
        days = int(match.group(1))
        if days < 1:
            raise CommandError("--expires must be at least 1d.")
        return timezone.now() + dt.timedelta(days=days)
    try:
        when = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise CommandError(
            f"--expires must be a date (2027-01-01), a datetime or a number of days (30d): {value!r}."
        ) from None
    if timezone.is_naive(when):
        when = when.replace(tzinfo=dt.UTC)
    if when <= timezone.now():
        raise CommandError("--expires must be in the future.")
    return when


class Command(BaseCommand):
    help = "Create an API key for a user and print it (only the key, on stdout): it cannot be shown again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--scopes",
            default=DEFAULT_SCOPES,
            help=f"Comma-separated, from: {', '.join(ApiKey.Scope.values)} (default {DEFAULT_SCOPES}).",
        )
        parser.add_argument("--expires", help="A date (2027-01-01), a datetime, or days from now (30d).")
        parser.add_argument("--name", default="command line", help="A label to tell the key apart.")

    def handle(self, *args, username: str, scopes: str, expires: str | None, name: str, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user is called {username!r}.")
        scope_list = [s.strip() for s in scopes.split(",") if s.strip()]
        unknown = sorted(set(scope_list) - set(ApiKey.Scope.values))
        if unknown or not scope_list:
            raise CommandError(
                f"Unknown scope(s) {', '.join(unknown) or '(none given)'}; choose from: {', '.join(ApiKey.Scope.values)}."
            )
        try:
            created = api_key_create(user=user, name=name, scopes=scope_list, expires_at=parse_expiry(expires))
        except ClientError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(created.key)
        self.stderr.write(f"Created {created.api_key} for {username} with scopes {', '.join(created.api_key.scopes)}.")
