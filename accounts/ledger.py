"""The ledger as accounts reaches it: the quotas count what it holds, and the lighter endpoints below
it (moderation, embeddings) are charged to it. It lives in billing, a layer above, which installs
itself here at start-up (its AppConfig.ready); accounts never imports it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Protocol

from django.core.exceptions import ImproperlyConfigured

from accounts.models import User


class Ledger(Protocol):
    def tokens_since_each(self, *, user: User, since: Sequence[dt.datetime]) -> list[int]:
        """The tokens the user used since each of `since` that count towards a quota, in one read:
        a send and an answer's end count every quota period of the plan."""
        ...

    def moderation_charge(self, *, user_id: int, tier_id: int | None, tokens: int) -> None:
        """Record a /v1/moderations request's input tokens (free of charge, counted by the quotas)."""
        ...

    def embedding_charge(self, *, user_id: int, deployment_id: int, tokens: int) -> None:
        """Record an embeddings request's input tokens at the tier's prompt price for the deployment."""
        ...


_installed: list[Ledger] = []


def ledger_install(ledger: Ledger) -> None:
    _installed[:] = [ledger]


def ledger() -> Ledger:
    if not _installed:
        raise ImproperlyConfigured("No ledger is installed: add 'billing' to INSTALLED_APPS.")
    return _installed[0]
