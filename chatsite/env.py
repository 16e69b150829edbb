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


SSO_PRESETS = ("oidc", "google", "github", "microsoft")
SSO_SLUG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def sso_url_problem(url: str) -> str:
    """Why `url` cannot be an identity provider's address (empty when it can): it must be https, or
    http on this machine's loopback (a provider run beside the service, as the tests do)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return ""
    if parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS:
        return ""
    return f"{url!r} is not an https URL"


def sso_tier_map(name: str, raw: str) -> list[tuple[str, str]]:
    """`admins=enterprise,staff=pro`: a provider's group or role value, and the tier it maps to, in
    order (the first value a person has wins)."""
    pairs = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        value, sep, tier = item.rpartition("=")
        if not sep or not value.strip() or not tier.strip():
            raise ImproperlyConfigured(f"{name} takes value=tier pairs such as admins=enterprise, got {item!r}")
        pairs.append((value.strip(), tier.strip()))
    return pairs


def sso_providers_from_env(name: str) -> list[dict[str, object]]:
    """The identity providers `name` lists (`google,corp`), each from its `SSO_<NAME>_*` variables:
    PRESET (oidc, google, github or microsoft; a preset's own name needs none), ISSUER (OpenID
    Connect; a preset knows its own), TENANT (Microsoft Entra ID), CLIENT_ID, CLIENT_SECRET, LABEL,
    SCOPES, TIER_CLAIM and TIER_MAP (a claim's values mapped to tiers at each sign-in),
    CREATE_ACCOUNTS (default on)."""
    providers: list[dict[str, object]] = []
    for slug in (item.lower() for item in env_list(name, [])):
        if not slug or not set(slug) <= SSO_SLUG_CHARS or len(slug) > 32:
            raise ImproperlyConfigured(f"{name} takes names of letters, digits and -, got {slug!r}")
        prefix = f"SSO_{slug.upper().replace('-', '_')}_"
        preset = env_choice(prefix + "PRESET", slug if slug in SSO_PRESETS else "oidc", choices=SSO_PRESETS)
        issuer = env_str(prefix + "ISSUER")
        tenant = env_str(prefix + "TENANT")
        client_id, client_secret = env_str(prefix + "CLIENT_ID"), env_str(prefix + "CLIENT_SECRET")
        if not client_id or not client_secret:
            raise ImproperlyConfigured(f"{prefix}CLIENT_ID and {prefix}CLIENT_SECRET are needed for {slug}")
        if preset == "oidc" and not issuer:
            raise ImproperlyConfigured(f"{prefix}ISSUER is needed: the provider's OpenID Connect issuer URL")
        if preset == "microsoft" and not tenant and not issuer:
            raise ImproperlyConfigured(f"{prefix}TENANT is needed: the Entra ID tenant's id (a GUID)")
        if issuer and (problem := sso_url_problem(issuer)):
            raise ImproperlyConfigured(f"{prefix}ISSUER: {problem}")
        providers.append(
            {
                "slug": slug,
                "preset": preset,
                "label": env_str(prefix + "LABEL"),
                "issuer": issuer,
                "tenant": tenant,
                "client_id": client_id,
                "client_secret": client_secret,
                "scopes": env_str(prefix + "SCOPES"),
                "tier_claim": env_str(prefix + "TIER_CLAIM"),
                "tier_map": sso_tier_map(prefix + "TIER_MAP", env_str(prefix + "TIER_MAP")),
                "create_accounts": env_bool(prefix + "CREATE_ACCOUNTS", True),
            }
        )
    return providers
