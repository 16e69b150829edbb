"""`manage.py unlocklogin [USERNAME ...] [--address ADDRESS ...]`: lift sign-in locks at once."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.services import login_unlock


class Command(BaseCommand):
    help = (
        "Lift the sign-in locks of accounts and client addresses that failed too often (they also lift by themselves)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("usernames", nargs="*")
        parser.add_argument("--address", action="append", default=[], help="A client address to unlock (repeatable).")

    def handle(self, *args, usernames: list[str], address: list[str], **options) -> None:
        if not usernames and not address:
            raise CommandError("Name at least one username or --address.")
        login_unlock(usernames=usernames, addresses=address)
        self.stderr.write(f"Unlocked {len(usernames)} accounts and {len(address)} addresses.")
