"""Small typed readers for settings that come from the environment.

Each raises ImproperlyConfigured with the variable's name when its value is nonsense, so a bad
deployment fails at start-up with a message that says what to fix.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false, yes/no), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """A comma-separated list of addresses or networks (`10.0.0.5`, `10.0.0.0/8`, `fd00::/8`); empty
    when unset."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} takes IP addresses or networks such as 10.0.0.5 or 10.0.0.0/8, got {item!r}"
            ) from None
    return networks


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name, "").strip()
    return Path(raw).expanduser().resolve() if raw else default


def env_url(name: str, schemes: tuple[str, ...]) -> str:
    """A URL whose scheme must be one of `schemes`; empty when the variable is unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return ""
    scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
    if scheme not in schemes:
        raise ImproperlyConfigured(
            f"{name} must be a URL starting with one of {', '.join(s + '://' for s in schemes)}; "
            f"got {raw.split('@')[-1]!r}"
        )
    return raw


def env_choice(name: str, default: str, *, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}; got {raw!r}")
    return value


def env_origin(name: str) -> str:
    """An origin (`https://chat.example.com`, a port allowed, no path); empty when unset."""
    raw = env_url(name, ("http", "https"))
    if not raw:
        return ""
    parts = urlsplit(raw)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = parts._replace(netloc="")
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ImproperlyConfigured(f"{name} must be an origin such as https://chat.example.com, got {raw!r}")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def secret_key_from_env_or_file(name: str, path: Path, *, allow_file: bool) -> str:
    """The secret key from the environment or, for the embedded default only, from a file made once.

    The file lives in the local data folder (never in the repository) so a developer's sessions
    survive restarts without anyone having to invent a key.
    """
    value = os.environ.get(name, "").strip()
    if value:
        if len(value) < 32:
            raise ImproperlyConfigured(f"{name} must be at least 32 characters long")
        return value
    if not allow_file:
        raise ImproperlyConfigured(f"{name} must be set when DATABASE_URL or REDIS_URL is set")
    if path.exists():
        return path.read_text().strip()
    from django.core.management.utils import get_random_secret_key

    path.parent.mkdir(parents=True, exist_ok=True)
    key = get_random_secret_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key
