"""What accounts needs to know from the apps above it, which it cannot import: each app registers
its answer at start-up (its `AppConfig.ready`), and accounts calls what is registered. A hook, unlike
a signal, is for a value returned; signals are kept for side effects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from accounts.models import User
from accounts.protocols import ListedDeployment


class TokensReserved(Protocol):
    """The tokens a user's unfinished work in an app may still use, counted against their quotas
    (inference answers for its generations)."""

    def __call__(self, *, user: User) -> int: ...


_tokens_reserved: list[TokensReserved] = []


def quota_reservation_register(count: TokensReserved) -> None:
    """Count `count(user=...)` among the tokens held against a user's quotas; once per app, at start-up."""
    if count not in _tokens_reserved:
        _tokens_reserved.append(count)


def quota_tokens_reserved(*, user: User) -> int:
    """The tokens the user's unfinished work may still use, in every app that registered a count."""
    return sum(count(user=user) for count in _tokens_reserved)


class EnabledDeployments(Protocol):
    """The enabled chat deployments (inference's), for the pages of accounts that list models."""

    def __call__(self) -> Sequence[ListedDeployment]: ...


_enabled_deployments: list[EnabledDeployments] = []


def deployments_enabled_register(list_enabled: EnabledDeployments) -> None:
    """Have `deployments_enabled` answer with `list_enabled()`; inference's, at start-up."""
    _enabled_deployments[:] = [list_enabled]


def deployments_enabled() -> list[ListedDeployment]:
    return [deployment for list_enabled in _enabled_deployments for deployment in list_enabled()]


class AccountDataExport(Protocol):
    """What an app holds about a person, as files for their archive: path in the archive -> bytes."""

    def __call__(self, *, user: User) -> dict[str, bytes]: ...


_account_exports: list[AccountDataExport] = []


def account_export_register(export: AccountDataExport) -> None:
    """Put what `export(user=...)` returns into a person's data archive; once per app, at start-up.
    Everything an app keeps about a person goes with their account (its rows point to the user with
    CASCADE, or are kept without content as billing's ledger is); this says what they take with them."""
    if export not in _account_exports:
        _account_exports.append(export)


def account_export_files(*, user: User) -> dict[str, bytes]:
    """Every registered app's files for the user's archive; a path two apps both give is an error."""
    files: dict[str, bytes] = {}
    for export in _account_exports:
        for path, data in export(user=user).items():
            if path in files:
                raise ValueError(f"two apps export {path!r}")
            files[path] = data
    return files
