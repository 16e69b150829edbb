"""Identity providers: their configuration, and Authlib's client for each, which runs the
authorization code flow (PKCE, `state`, `nonce`) and validates ID tokens against the provider's
JWKS keys (signature, issuer, audience, expiry, nonce). What a provider's answer means for an account
is `accounts.identity`'s.

Authlib's Django client keeps each flow's `state`, PKCE verifier, nonce and redirect URI in the
session; `_FlowIntegration` adds the expiry its own lookup does not check. Providers come from the
environment (settings.SSO_PROVIDERS) and from the admin (`IdentityProvider` rows).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from authlib.common.errors import AuthlibBaseError
from authlib.integrations.django_client import DjangoOAuth2App
from authlib.integrations.django_client.integration import DjangoIntegration
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from joserfc.errors import JoseError

from accounts.models import ExternalIdentity, IdentityProvider, User
from chatsite.env import sso_url_problem
from chatsite.errors import ClientError

log = logging.getLogger(__name__)

# How long a sign-in may take at the provider: a `state` older than this is refused.
FLOW_MAX_AGE_S = 600
HTTP_TIMEOUT_S = 10
GITHUB = "github"
PRESET_LABELS = {"google": "Google", "github": "GitHub", "microsoft": "Microsoft"}
PRESET_SCOPES = {"github": "read:user user:email"}
DEFAULT_SCOPES = "openid email profile"


@dataclass(frozen=True)
class Provider:
    """One identity provider, as configured (environment or admin)."""

    slug: str
    preset: str
    label: str
    client_id: str
    client_secret: str
    issuer: str = ""
    tenant: str = ""
    scopes: str = ""
    tier_claim: str = ""
    tier_map: tuple[tuple[str, str], ...] = ()
    create_accounts: bool = True

    @property
    def is_oidc(self) -> bool:
        return self.preset != GITHUB

    @property
    def display_name(self) -> str:
        return self.label or PRESET_LABELS.get(self.preset, self.slug)

    @property
    def scope(self) -> str:
        return self.scopes or PRESET_SCOPES.get(self.preset, DEFAULT_SCOPES)

    @property
    def issuer_url(self) -> str:
        """The OpenID Connect issuer whose discovery document names the endpoints and keys."""
        if self.preset == "google":
            return self.issuer or "https://accounts.google.com"
        if self.preset == "microsoft":
            # A tenant's own issuer: the multi-tenant ones ("common") name no single issuer to check.
            return self.issuer or f"https://login.microsoftonline.com/{self.tenant}/v2.0"
        return self.issuer

    @property
    def github_web(self) -> str:
        return (self.issuer or "https://github.com").rstrip("/")

    @property
    def github_api(self) -> str:
        """api.github.com, or a GitHub Enterprise Server's /api/v3/."""
        return "https://api.github.com/" if not self.issuer else f"{self.github_web}/api/v3/"


def _from_settings(entry: dict[str, Any]) -> Provider:
    return Provider(
        slug=entry["slug"],
        preset=entry["preset"],
        label=entry["label"],
        client_id=entry["client_id"],
        client_secret=entry["client_secret"],
        issuer=entry["issuer"],
        tenant=entry["tenant"],
        scopes=entry["scopes"],
        tier_claim=entry["tier_claim"],
        tier_map=tuple((str(value), str(tier)) for value, tier in entry["tier_map"]),
        create_accounts=entry["create_accounts"],
    )


def _from_row(row: IdentityProvider) -> Provider | None:
    secret = os.environ.get(row.client_secret_env, "").strip() if row.client_secret_env else ""
    if not secret:
        log.warning("identity provider %s: its secret variable %s is not set", row.slug, row.client_secret_env)
        return None
    if row.issuer and sso_url_problem(row.issuer):
        log.warning("identity provider %s: %s", row.slug, sso_url_problem(row.issuer))
        return None
    tier_map = row.tier_map if isinstance(row.tier_map, list) else []
    return Provider(
        slug=row.slug,
        preset=row.preset,
        label=row.label,
        client_id=row.client_id,
        client_secret=secret,
        issuer=row.issuer,
        tenant=row.tenant,
        scopes=row.scopes,
        tier_claim=row.tier_claim,
        tier_map=tuple(
            (str(pair[0]), str(pair[1])) for pair in tier_map if isinstance(pair, list | tuple) and len(pair) == 2
        ),
        create_accounts=row.create_accounts,
    )


def provider_list() -> list[Provider]:
    """The providers people may sign in through: the environment's, then the admin's enabled ones
    (a slug the environment has already is the environment's)."""
    providers = [_from_settings(entry) for entry in settings.SSO_PROVIDERS]
    taken = {provider.slug for provider in providers}
    for row in IdentityProvider.objects.filter(enabled=True).exclude(slug__in=taken).order_by("slug"):
        if (provider := _from_row(row)) is not None:
            providers.append(provider)
    return providers


def providers_linked_to(*, user: User) -> list[Provider]:
    """The configured providers this user has signed in through: where they can prove who they are."""
    linked = set(ExternalIdentity.objects.filter(user=user).values_list("provider", flat=True))
    return [provider for provider in provider_list() if provider.slug in linked]


def provider_get(*, slug: str) -> Provider | None:
    return next((provider for provider in provider_list() if provider.slug == slug), None)


class _FlowIntegration(DjangoIntegration):
    """Authlib's session storage of a flow's state, which also refuses a state past its expiry."""

    expires_in = FLOW_MAX_AGE_S

    def get_state_data(self, session, state):
        if not isinstance(state, str) or not state:
            return None
        stored = session.get(f"_state_{self.name}_{state}")
        if (
            not isinstance(stored, dict)
            or not isinstance(stored.get("exp"), int | float)
            or stored["exp"] < time.time()
        ):
            return None
        return super().get_state_data(session, state)


@lru_cache(maxsize=64)
def _client(provider: Provider) -> DjangoOAuth2App:
    """Authlib's client for the provider, kept per configuration: it caches the discovery document
    and the JWKS keys (fetched again when a token names a key it has not seen: a rotation)."""
    common: dict[str, Any] = {
        "client_id": provider.client_id,
        "client_secret": provider.client_secret,
        "client_kwargs": {"scope": provider.scope, "code_challenge_method": "S256", "timeout": HTTP_TIMEOUT_S},
    }
    framework = _FlowIntegration(f"sso-{provider.slug}")
    if provider.is_oidc:
        discovery = provider.issuer_url.rstrip("/") + "/.well-known/openid-configuration"
        return DjangoOAuth2App(framework, name=framework.name, server_metadata_url=discovery, **common)
    return DjangoOAuth2App(
        framework,
        name=framework.name,
        authorize_url=f"{provider.github_web}/login/oauth/authorize",
        access_token_url=f"{provider.github_web}/login/oauth/access_token",
        api_base_url=provider.github_api,
        **common,
    )


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def form_action_allow(response: HttpResponse, providers: list[Provider]) -> HttpResponse:
    """Let the page's provider buttons post to the service and be redirected on to the providers:
    a browser applies the page's CSP form-action to the redirect too. The authorization endpoint's
    origin, where its discovery document was read already; otherwise the issuer's, where
    providers keep it."""
    origins = []
    for provider in providers:
        endpoint = _client(provider).server_metadata.get("authorization_endpoint") if provider.is_oidc else ""
        origin = _origin(str(endpoint or "")) or _origin(
            provider.issuer_url if provider.is_oidc else provider.github_web
        )
        if origin and origin not in origins:
            origins.append(origin)
    if origins:
        update = dict(getattr(response, "_csp_update", None) or {})
        update["form-action"] = [*update.get("form-action", []), *origins]
        response._csp_update = update  # type: ignore[attr-defined]  # django-csp's per-response change
    return response


def _unavailable(provider: Provider) -> ClientError:
    return ClientError(
        f"{provider.display_name} cannot be reached just now. Try again in a minute.",
        code="sso_unavailable",
        status=502,
    )


def authorization_redirect(
    *, request: HttpRequest, provider: Provider, redirect_uri: str, **params: str
) -> HttpResponse:
    """The redirect to the provider's sign-in page; the flow's state waits in the session."""
    client = _client(provider)
    try:
        if provider.is_oidc:
            _check_issuer(provider, client.load_server_metadata())
        return client.authorize_redirect(request, redirect_uri, **params)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        log.warning("identity provider %s: %s", provider.slug, exc)
        raise _unavailable(provider) from None


def _check_issuer(provider: Provider, metadata: dict) -> None:
    # OpenID Connect Discovery: the document's issuer must be the one configured, or a look-alike
    # document could name keys and endpoints of its own.
    if str(metadata.get("issuer", "")).rstrip("/") != provider.issuer_url.rstrip("/"):
        raise ValueError(f"discovery names issuer {metadata.get('issuer')!r}, not {provider.issuer_url!r}")


@dataclass(frozen=True)
class ProviderIdentity:
    """Who the provider says signed in: checked, typed, nothing else of its answer."""

    provider: str
    subject: str
    email: str
    email_verified: bool
    username_hint: str
    groups: tuple[str, ...]


def _refused(message: str, code: str = "sso_refused") -> ClientError:
    return ClientError(message, code=code, status=400)


def authorization_finish(*, request: HttpRequest, provider: Provider) -> ProviderIdentity:
    """Finish the flow the provider sent the browser back from: the `state` must be one this session
    started (and not expired), the code is exchanged with the PKCE verifier, the ID token is checked
    against the provider's keys (signature, issuer, audience, expiry, nonce). Anything else is a
    400 (sso_refused) or, when the provider cannot be reached, a 502."""
    client = _client(provider)
    if request.GET.get("error"):
        raise _refused(f"{provider.display_name} did not sign you in.", code="sso_cancelled")
    if not request.GET.get("code") or not request.GET.get("state"):
        raise _refused("That sign-in link is incomplete. Start again from the sign-in page.")
    try:
        options = {}
        if provider.preset == "google" and not provider.issuer:
            # Google documents both spellings of its issuer in ID tokens.
            options["claims_options"] = {"iss": {"values": ["https://accounts.google.com", "accounts.google.com"]}}
        token = client.authorize_access_token(request, **options)
        if provider.is_oidc:
            if "userinfo" not in token:
                raise _refused(f"{provider.display_name} sent no ID token.")
            claims = dict(token["userinfo"])
            groups = _claim_values(claims.get(provider.tier_claim)) if provider.tier_claim else ()
            return _oidc_identity(provider, claims, groups)
        return _github_identity(provider, client, token)
    except ClientError:
        raise
    except (AuthlibBaseError, JoseError) as exc:
        log.info("identity provider %s refused a sign-in: %s", provider.slug, exc)
        raise _refused("That sign-in could not be checked (it may have expired). Start again.") from None
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        log.warning("identity provider %s: %s", provider.slug, exc)
        raise _unavailable(provider) from None


def _claim_values(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(str(item) for item in value if isinstance(item, str | int))
    return ()


def _oidc_identity(provider: Provider, claims: dict[str, Any], groups: tuple[str, ...]) -> ProviderIdentity:
    subject, email = claims.get("sub"), claims.get("email")
    if not isinstance(subject, str) or not subject:
        raise _refused(f"{provider.display_name} did not say who you are.")
    verified = claims.get("email_verified") is True
    if provider.preset == "microsoft":
        # Entra ID sends no email_verified; its optional claim xms_edov says the domain's owner
        # verified the address (docs/sso.md).
        verified = verified or claims.get("xms_edov") in (True, "1", "true")
    hint = claims.get("preferred_username") or claims.get("nickname") or ""
    return ProviderIdentity(
        provider=provider.slug,
        subject=subject[:255],
        email=email.strip() if isinstance(email, str) else "",
        email_verified=verified and isinstance(email, str),
        username_hint=str(hint)[:150],
        groups=groups,
    )


def _github_identity(provider: Provider, client: DjangoOAuth2App, token: dict) -> ProviderIdentity:
    """GitHub speaks OAuth 2.0, not OpenID Connect: who signed in is its /user, and their verified
    address its /user/emails' primary one (verified by GitHub)."""
    user = client.get("user", token=token)
    user.raise_for_status()
    profile = user.json()
    emails = client.get("user/emails", token=token)
    emails.raise_for_status()
    listed = emails.json()
    if not isinstance(profile, dict) or not isinstance(profile.get("id"), int) or not isinstance(listed, list):
        raise _refused("GitHub did not say who you are.")
    primary = next((e for e in listed if isinstance(e, dict) and e.get("primary") is True), None)
    email = primary.get("email") if primary is not None else ""
    return ProviderIdentity(
        provider=provider.slug,
        subject=str(profile["id"]),
        email=email.strip() if isinstance(email, str) else "",
        email_verified=primary is not None and primary.get("verified") is True and isinstance(email, str),
        username_hint=str(profile.get("login") or "")[:150],
        groups=(),
    )
