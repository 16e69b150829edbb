"""Settings, all from the environment.

With no variable set this is the embedded default: SQLite and an in-memory channel layer in a
local data folder, generation inside the web process. DATABASE_URL switches to PostgreSQL;
REDIS_URL switches the channel layer, cache and Celery broker to Redis and moves generation
to Celery GPU workers.
"""

from __future__ import annotations

import re
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from chatsite.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_origin,
    env_path,
    env_str,
    env_url,
    secret_key_from_env_or_file,
    sso_providers_from_env,
)
from chatsite.origins import trusted_origin_valid
from chatsite.redis_clients import REDIS_CONNECT_TIMEOUT_S, REDIS_HEALTH_CHECK_S, redis_connection_options
from inference.defaults import DEFAULT_DEPLOYMENT_NAME

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = env_path("CHATSITE_DATA_DIR", BASE_DIR / "var")

DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
EMBEDDED = not DATABASE_URL and not REDIS_URL

DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = secret_key_from_env_or_file(
    "DJANGO_SECRET_KEY", DATA_DIR / "secret_key", allow_file=EMBEDDED or env_bool("CHATSITE_LOCAL_SECRET", False)
)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])
# The address people reach the service at (https://chat.example.com): trusted for CSRF, and an https
# one turns the HTTPS protections on (below).
PUBLIC_ORIGIN = env_origin("DJANGO_PUBLIC_ORIGIN")
if PUBLIC_ORIGIN and PUBLIC_ORIGIN not in CSRF_TRUSTED_ORIGINS:
    CSRF_TRUSTED_ORIGINS.append(PUBLIC_ORIGIN)
# Origins besides the page's own that may open the chat socket (chatsite/origins.py).
WEBSOCKET_TRUSTED_ORIGINS = env_list("DJANGO_WEBSOCKET_TRUSTED_ORIGINS", list(CSRF_TRUSTED_ORIGINS))
if bad_origins := [origin for origin in WEBSOCKET_TRUSTED_ORIGINS if not trusted_origin_valid(origin)]:
    raise ImproperlyConfigured(
        f"DJANGO_WEBSOCKET_TRUSTED_ORIGINS (or DJANGO_CSRF_TRUSTED_ORIGINS) takes origins like"
        f" https://chat.example.com or https://*.example.com:8443, not {', '.join(bad_origins)}"
    )

INSTALLED_APPS = [
    # First, so `manage.py runserver` is daphne's and serves the chat socket too (Channels' setup).
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "servestatic.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "csp",
    "accounts",
    "conversations",
    "inference",
    "billing",
    "moderation",
    "orchestration",
    "documents",
    "observability",
]

MIDDLEWARE = [
    # First: everything below reads the client's address and scheme as a trusted proxy gave them.
    "chatsite.proxies.forwarded_headers_from_proxies_only",
    "django.middleware.security.SecurityMiddleware",
    # First after security: every response, static files and errors included, carries its request id.
    "observability.middleware.request_observed",
    "servestatic.middleware.ServeStaticMiddleware",
    # Below the static files, which keep their long caching; above everything that answers a user.
    "chatsite.security.private_responses_not_stored",
    "chatsite.security.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.context_processors.theme",
            ],
        },
    },
]

if DATABASE_URL:
    try:
        DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Long-lived async workers hold connections across event-loop turns; recycle them.
        DATABASES["default"]["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "db.sqlite3"),
            # A file, not shared-cache memory: the engine's threads write while tests read, and
            # shared-cache SQLite fails such writers at once instead of waiting.
            "TEST": {"NAME": str(DATA_DIR / "test-db.sqlite3")},
            # Streams finish while other requests read: wait for the lock instead of failing.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
        }
    }
# Threads (each with its own connection) that run async code's database calls side by side on
# PostgreSQL, per process (chatsite/database.py). SQLite uses one.
DATABASE_ASYNC_THREADS = env_int("DATABASE_ASYNC_THREADS", 8, minimum=1, maximum=64)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "conversations:chat"
LOGOUT_REDIRECT_URL = "accounts:login"
# Accounts created an hour (accounts.services.signup_admit), per client address and per its network
# (an IPv4 /24, an IPv6 /64); 0: no limit.
SIGNUPS_PER_ADDRESS_PER_HOUR = env_int("SIGNUPS_PER_ADDRESS_PER_HOUR", 3, minimum=0)
SIGNUPS_PER_NETWORK_PER_HOUR = env_int("SIGNUPS_PER_NETWORK_PER_HOUR", 10, minimum=0)
# Password reset: a link works once (its token signs the password hash) and for this long; requests
# an hour per client address and per email address (accounts.services.password_reset_admit).
PASSWORD_RESET_TIMEOUT = env_int("PASSWORD_RESET_TIMEOUT_S", 3600, minimum=60)
PASSWORD_RESETS_PER_ADDRESS_PER_HOUR = env_int("PASSWORD_RESETS_PER_ADDRESS_PER_HOUR", 5, minimum=1)
PASSWORD_RESETS_PER_EMAIL_PER_HOUR = env_int("PASSWORD_RESETS_PER_EMAIL_PER_HOUR", 3, minimum=1)

# Who must sign in with a second factor (an authenticator app's code): "none", "staff" (the admin
# and the review queue hold other people's data) or "everyone". Applied at each sign-in.
TWO_FACTOR_REQUIRED = env_choice("TWO_FACTOR_REQUIRED", "none", choices=("none", "staff", "everyone"))

# Sign-in through identity providers (docs/sso.md): SSO_PROVIDERS names them, each configured by
# SSO_<NAME>_* variables (read by chatsite.env.sso_providers_from_env); more are added in the admin.
SSO_PROVIDERS = sso_providers_from_env("SSO_PROVIDERS")
# Passwords on ("on") or off ("off": sign-in through a provider only, except the accounts
# PASSWORD_SIGN_IN_ALLOWED names; "superusers" there stands for every superuser: the break-glass way in).
PASSWORD_SIGN_IN = env_choice("PASSWORD_SIGN_IN", "on", choices=("on", "off"))
PASSWORD_SIGN_IN_ALLOWED = env_list("PASSWORD_SIGN_IN_ALLOWED", ["superusers"])
# How long a sign-in through a provider counts as fresh enough to delete the account or remove a
# second factor of an account that has no password.
SSO_REAUTHENTICATE_S = env_int("SSO_REAUTHENTICATE_S", 600, minimum=60)
# Passkeys (docs/passkeys.md): the relying party's id (the site's domain) and the origins a passkey's
# signature may name; by default the request's own host and origin.
PASSKEY_RP_ID = env_str("PASSKEY_RP_ID", "")
PASSKEY_ORIGINS = env_list("PASSKEY_ORIGINS", [PUBLIC_ORIGIN] if PUBLIC_ORIGIN else [])

# Verifying an account's email address (a signed link sent at sign-up): "optional" (sign-in does not
# wait for it) or "required" (sign-up needs an address, and sign-in waits until it is verified).
EMAIL_VERIFICATION = env_choice("EMAIL_VERIFICATION", "optional", choices=("optional", "required"))
EMAIL_VERIFICATION_MAX_AGE_S = env_int("EMAIL_VERIFICATION_MAX_AGE_S", 3 * 86400, minimum=600)
EMAIL_VERIFICATIONS_PER_HOUR = env_int("EMAIL_VERIFICATIONS_PER_HOUR", 3, minimum=1)

# Email: printed to the console in the embedded default; sent over SMTP once EMAIL_HOST is set.
EMAIL_HOST = env_str("EMAIL_HOST", "")
if EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1, maximum=65535)
    EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
    EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
    EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", EMAIL_PORT == 587)
    EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", EMAIL_PORT == 465)
    EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT_S", 10, minimum=1)
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "chat@localhost")

# Argon2id first, as OWASP recommends for password storage; PBKDF2 stays so that passwords hashed
# before it still verify (and are rehashed with Argon2id at their next sign-in).
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
SERVESTATIC_USE_FINDERS = True  # serve straight from static/ without a collectstatic step

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# The proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (chatsite/proxies.py): those
# DJANGO_TRUSTED_PROXIES names, or with DJANGO_BEHIND_PROXY alone whatever peer connects. Neither: none.
TRUSTED_PROXIES = env_networks("DJANGO_TRUSTED_PROXIES")
if TRUSTED_PROXY := env_bool("DJANGO_BEHIND_PROXY", False) or bool(TRUSTED_PROXIES):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Served over HTTPS: on by default in production once an https origin is configured, so a deployment
# that names its https address gets HSTS and cookies a plain-HTTP hop never carries without opting in.
HTTPS = env_bool(
    "DJANGO_HTTPS", not DEBUG and any(origin.lower().startswith("https://") for origin in CSRF_TRUSTED_ORIGINS)
)
# Browsers remember HSTS for this long; Django sends it only on requests it sees as secure (a proxy's
# requests need DJANGO_BEHIND_PROXY).
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000 if HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", HTTPS)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", False)  # a commitment hard to take back: opt in
SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", HTTPS)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("DJANGO_SSL_REDIRECT", False)
SECURE_REFERRER_POLICY = env_choice(
    "DJANGO_REFERRER_POLICY",
    "same-origin",
    choices=(
        "no-referrer",
        "no-referrer-when-downgrade",
        "origin",
        "origin-when-cross-origin",
        "same-origin",
        "strict-origin",
        "strict-origin-when-cross-origin",
        "unsafe-url",
    ),
)
# Scripts, styles and everything else from this site only: no inline script or style, no eval, no
# framing. chatsite.security adds the socket's ws(s) origin to connect-src for each request's host.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

if REDIS_URL:
    # The pub/sub layer: one PUBLISH per message, delivered at most once. It costs the stack less
    # CPU per streamed token than the list-based layer's eight round trips (docs/performance.md); what
    # live delivery skips, followers take from the replay buffer (inference/streaming/streams.py).
    # Every Redis client retries a command on a connection a Redis restart left stale
    # (chatsite/redis_clients.py): the layer's and the cache's pools too.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [{"address": REDIS_URL, **redis_connection_options(asynchronous=True)}]},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "chatsite.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": redis_connection_options(),
        }
    }
else:
    # The embedded default only: one process, so an in-memory layer is enough. Streams are coalesced,
    # but a slow reader must still not make publishing fail.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- inference -----------------------------------------------------------------------------------
# "local": generation runs in the web process (the embedded default). "celery": GPU workers do it.
INFERENCE_BACKEND = env_str("INFERENCE_BACKEND", "celery" if REDIS_URL else "local")
if INFERENCE_BACKEND not in {"local", "celery"}:
    raise ImproperlyConfigured(f"INFERENCE_BACKEND must be 'local' or 'celery', got {INFERENCE_BACKEND!r}")
if INFERENCE_BACKEND == "celery" and not REDIS_URL:
    raise ImproperlyConfigured("INFERENCE_BACKEND=celery needs REDIS_URL (broker and channel layer)")
INFERENCE_MODELS_DIR = env_path("INFERENCE_MODELS_DIR", DATA_DIR / "models")
INFERENCE_DEFAULT_DEPLOYMENT = env_str("INFERENCE_DEFAULT_DEPLOYMENT", DEFAULT_DEPLOYMENT_NAME)
# Deployments this process hosts an engine for (local backend, or a worker when not given --queues).
INFERENCE_LOCAL_DEPLOYMENTS = env_list("INFERENCE_LOCAL_DEPLOYMENTS", [INFERENCE_DEFAULT_DEPLOYMENT])
# "scripted": every generating deployment runs on the scripted engine (inference/engine/scripted.py),
# whatever its own `engine` says: for load tests and demos with no model. Web processes and workers
# must agree. Blank: each deployment's own.
INFERENCE_ENGINE = env_str("INFERENCE_ENGINE", "")
if INFERENCE_ENGINE not in {"", "vllm", "scripted"}:
    raise ImproperlyConfigured(f"INFERENCE_ENGINE must be 'vllm', 'scripted' or blank, got {INFERENCE_ENGINE!r}")
# The scripted engine's pace, tokens a second per answer; 0: as fast as the event loop turns.
INFERENCE_SCRIPTED_TOKENS_PER_S = env_float("INFERENCE_SCRIPTED_TOKENS_PER_S", 25.0, minimum=0)
# CUDA graphs / torch.compile make start-up minutes long on the CPU; eager is the right default there.
INFERENCE_ENFORCE_EAGER = env_bool("INFERENCE_ENFORCE_EAGER", True)
# On a CPU host vLLM's scheduler process busy-waits for each step's output, a whole core while it
# generates; it sleeps after this many milliseconds instead (docs/performance.md). 1000 leaves it.
INFERENCE_CPU_SCHEDULER_SPIN_MS = env_int("INFERENCE_CPU_SCHEDULER_SPIN_MS", 2, minimum=0, maximum=1000)
INFERENCE_CPU_WORKER_SPIN_MS = env_int("INFERENCE_CPU_WORKER_SPIN_MS", 100, minimum=0, maximum=1000)
# A stream's text goes out at once at first, then with the first text this long after its last send
# (pending text waits twice this at most, when the engine pauses), or once _CHARS have piled up
# (inference.streaming.streams.StreamPublisher).
INFERENCE_STREAM_COALESCE_MS = env_int("INFERENCE_STREAM_COALESCE_MS", 50, minimum=0, maximum=1000)
INFERENCE_STREAM_COALESCE_CHARS = env_int("INFERENCE_STREAM_COALESCE_CHARS", 96, minimum=1)
# How long a followed stream may stay quiet before its follower looks in the replay buffer for events
# live delivery may have dropped (an ending, say, or all that was sent while a connection was down).
INFERENCE_STREAM_RESYNC_S = env_float("INFERENCE_STREAM_RESYNC_S", 5.0, minimum=0.05)
INFERENCE_REPLAY_TTL_S = env_int("INFERENCE_REPLAY_TTL_S", 900, minimum=10)
INFERENCE_MIN_OUTPUT_TOKENS = env_int("INFERENCE_MIN_OUTPUT_TOKENS", 32, minimum=1)
INFERENCE_ENGINE_START_TIMEOUT_S = env_float("INFERENCE_ENGINE_START_TIMEOUT_S", 600, minimum=1)
# Admission control and queue order (see inference/scheduling.py).
INFERENCE_AT_CAPACITY_RETRY_S = env_int("INFERENCE_AT_CAPACITY_RETRY_S", 10, minimum=1)
INFERENCE_PRIORITY_AGING_S = env_float("INFERENCE_PRIORITY_AGING_S", 15, minimum=0)
CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 32_000, minimum=1)
# Chat sockets one user may hold open at once, across every web process (accounts/sockets.py); 0: no
# limit. A socket's place is renewed a third of this TTL apart, and lapses this long after its process died.
CHAT_SOCKETS_PER_USER = env_int("CHAT_SOCKETS_PER_USER", 20, minimum=0)
CHAT_SOCKET_PLACE_TTL_S = env_int("CHAT_SOCKET_PLACE_TTL_S", 60, minimum=3)
# Whether the model writes each conversation's title after its first answer (a short, uncharged,
# low-priority generation); off, a conversation is named after the first words of its first message.
CHAT_TITLES_FROM_MODEL = env_bool("CHAT_TITLES_FROM_MODEL", True)
# Whether a conversation's turns that fall out of the window are summarized (orchestration.memory,
# by the deployment's utility model, in the background); off, they are dropped (the sliding window).
CHAT_SUMMARIES = env_bool("CHAT_SUMMARIES", True)
# The semantic response cache (orchestration.cache; on per deployment): how close a prompt's
# sentence embedding must be to a cached one's (cosine similarity), how long an answer is kept, and
# how many of a deployment's newest answers a prompt is compared with.
RESPONSE_CACHE_SIMILARITY = env_float("RESPONSE_CACHE_SIMILARITY", 0.92, minimum=0.0)
RESPONSE_CACHE_TTL_S = env_int("RESPONSE_CACHE_TTL_S", 24 * 3600, minimum=1)
RESPONSE_CACHE_MAX_ENTRIES = env_int("RESPONSE_CACHE_MAX_ENTRIES", 2000, minimum=1)
# A prompt longer than the window times this many characters is refused before it is tokenized or
# moderated (accounts.services.request_size_check).
PROMPT_MAX_CHARS_PER_TOKEN = env_int("PROMPT_MAX_CHARS_PER_TOKEN", 8, minimum=1, maximum=1000)

# --- tools that run code and reach MCP servers (docs/tools-sandbox.md) ------------------------------
# `run_code` runs Python under bubblewrap: the bwrap program, the system Python it runs (under /usr,
# the only part of the machine the sandbox sees), and each run's limits. Its time limit is the lower
# of this and the tool loop's. A conversation's files live under RUN_CODE_DIR until it is deleted.
# Off: the tool is not offered, as on a machine where the sandbox cannot run (no user namespaces).
RUN_CODE_ENABLED = env_bool("RUN_CODE_ENABLED", True)
RUN_CODE_BWRAP = env_str("RUN_CODE_BWRAP", "bwrap")
RUN_CODE_PYTHON = env_path("RUN_CODE_PYTHON", Path("/usr/bin/python3"))
RUN_CODE_DIR = env_path("RUN_CODE_DIR", DATA_DIR / "run_code")
RUN_CODE_TIMEOUT_S = env_float("RUN_CODE_TIMEOUT_S", 30.0, minimum=1.0)
RUN_CODE_MEMORY_MB = env_int("RUN_CODE_MEMORY_MB", 512, minimum=64)
RUN_CODE_FILES_MB = env_int("RUN_CODE_FILES_MB", 64, minimum=1)
RUN_CODE_PROCESSES = env_int("RUN_CODE_PROCESSES", 32, minimum=4)
# The unprivileged user id the sandbox runs as when the service itself runs as root (the kernel does
# not hold root to a process limit); a service running as another user runs it as itself.
RUN_CODE_SANDBOX_UID = env_int("RUN_CODE_SANDBOX_UID", 65534, minimum=1)
# How long an MCP server's list of tools is kept before it is asked again (a change to its row in the
# admin asks again at once).
MCP_TOOLS_CACHE_S = env_float("MCP_TOOLS_CACHE_S", 60.0, minimum=0.0)
# The currency tier prices and the ledger's costs are in (ISO 4217), as the usage pages and the chat
# page show them (billing.money).
BILLING_CURRENCY = env_str("BILLING_CURRENCY", "USD").upper()
if not re.fullmatch(r"[A-Z]{3}", BILLING_CURRENCY):
    raise ImproperlyConfigured(
        f"BILLING_CURRENCY must be a three-letter currency code such as USD, got {BILLING_CURRENCY!r}"
    )
# CPU threads for the moderation classifiers' forward pass. One: a short text gains nothing from more,
# and a multi-threaded pass stalls at every barrier when an engine on the same cores holds them.
MODERATION_CPU_THREADS = env_int("MODERATION_CPU_THREADS", 1, minimum=1)
# How far below the web process's OS priority incoming messages are scored (docs/moderation.md).
MODERATION_INPUT_NICE = env_int("MODERATION_INPUT_NICE", 10, minimum=0, maximum=19)
# How long a message may wait for its scores at that priority before it is scored at the process's
# own: ten times a pass on a busy machine, and about when the engine's first step is done.
MODERATION_INPUT_LATE_S = env_float("MODERATION_INPUT_LATE_S", 0.5, minimum=0.0)
# The moderation embedder's dtype: "auto" times float32 and bfloat16 (where the CPU has native bf16)
# at load and keeps the faster, since which one wins differs from CPU to CPU.
MODERATION_EMBEDDER_DTYPE = env_str("MODERATION_EMBEDDER_DTYPE", "auto").lower()
if MODERATION_EMBEDDER_DTYPE not in {"auto", "float32", "bfloat16"}:
    raise ImproperlyConfigured(
        f"MODERATION_EMBEDDER_DTYPE must be 'auto', 'float32' or 'bfloat16', got {MODERATION_EMBEDDER_DTYPE!r}"
    )
# An optional guard model (Llama Guard) behind an OpenAI-compatible endpoint: an extra input classifier.
MODERATION_GUARD_URL = env_url("MODERATION_GUARD_URL", ("http", "https"))
MODERATION_GUARD_MODEL = env_str("MODERATION_GUARD_MODEL", "meta-llama/Llama-Guard-3-8B")
MODERATION_GUARD_API_KEY = env_str("MODERATION_GUARD_API_KEY", "")
MODERATION_GUARD_TIMEOUT_S = env_float("MODERATION_GUARD_TIMEOUT_S", 2.0, minimum=0.1)

# --- documents (docs/documents.md) ---------------------------------------------------------------
# A plan's file limits where it has no row of its own (documents.TierDocumentLimits); 0: no limit.
DOCUMENTS_MAX_FILE_BYTES = env_int("DOCUMENTS_MAX_FILE_BYTES", 10 * 1024 * 1024, minimum=0)
DOCUMENTS_MAX_FILES = env_int("DOCUMENTS_MAX_FILES", 50, minimum=0)
DOCUMENTS_MAX_TOTAL_BYTES = env_int("DOCUMENTS_MAX_TOTAL_BYTES", 100 * 1024 * 1024, minimum=0)
# Where an upload is extracted, chunked and embedded: "thread" (in this process, the embedded
# default) or "celery" (a task on the "documents" queue, for a `celery -Q documents` worker).
DOCUMENTS_PROCESSING = env_str("DOCUMENTS_PROCESSING", "celery" if REDIS_URL else "thread").lower()
if DOCUMENTS_PROCESSING not in {"thread", "celery"}:
    raise ImproperlyConfigured(f"DOCUMENTS_PROCESSING must be 'thread' or 'celery', got {DOCUMENTS_PROCESSING!r}")
if DOCUMENTS_PROCESSING == "celery" and not REDIS_URL:
    raise ImproperlyConfigured("DOCUMENTS_PROCESSING=celery needs REDIS_URL (the Celery broker)")
# The embedded default's processing threads: files of different users at once, one per user at a
# time (documents.background). Reading a file runs in a child process of its own.
DOCUMENTS_WORKERS = env_int("DOCUMENTS_WORKERS", 2, minimum=1, maximum=16)
# How many passages of a user's files a message's prompt may quote, at most.
DOCUMENTS_TOP_K = env_int("DOCUMENTS_TOP_K", 4, minimum=1, maximum=20)

# --- tools the service runs itself (docs/tools.md) ------------------------------------------------
# The limits of one answer's tool loop: model calls (steps), tool calls, and each call's time and output.
TOOLS_MAX_STEPS = env_int("TOOLS_MAX_STEPS", 4, minimum=1, maximum=16)
TOOLS_MAX_CALLS = env_int("TOOLS_MAX_CALLS", 4, minimum=1, maximum=32)
TOOLS_TIMEOUT_S = env_float("TOOLS_TIMEOUT_S", 20.0, minimum=0.1)
TOOLS_MAX_OUTPUT_CHARS = env_int("TOOLS_MAX_OUTPUT_CHARS", 4000, minimum=200, maximum=100_000)
# How long a call with side effects waits for the person's answer before it counts as refused.
TOOLS_APPROVAL_TIMEOUT_S = env_float("TOOLS_APPROVAL_TIMEOUT_S", 300.0, minimum=1)
# Web search: a SearXNG instance's JSON API (…/search), or a generic search API that takes `q` and
# answers JSON results, with its key sent as a bearer token. Unset: no web search tool.
TOOLS_SEARCH_URL = env_url("TOOLS_SEARCH_URL", ("http", "https"))
TOOLS_SEARCH_KIND = env_choice("TOOLS_SEARCH_KIND", "searxng", choices=("searxng", "generic"))
TOOLS_SEARCH_API_KEY = env_str("TOOLS_SEARCH_API_KEY", "")
# What one search costs the service (the provider's fee), charged to the person in the ledger's currency.
TOOLS_SEARCH_COST = env_str("TOOLS_SEARCH_COST", "0")
if not re.fullmatch(r"\d{1,6}(\.\d{1,8})?", TOOLS_SEARCH_COST):
    raise ImproperlyConfigured(f"TOOLS_SEARCH_COST must be a non-negative decimal, got {TOOLS_SEARCH_COST!r}")
# Fetching a page the model names: off unless the operator turns it on.
TOOLS_FETCH_ENABLED = env_bool("TOOLS_FETCH_ENABLED", False)
TOOLS_FETCH_MAX_BYTES = env_int("TOOLS_FETCH_MAX_BYTES", 1024 * 1024, minimum=1024)
TOOLS_FETCH_MAX_REDIRECTS = env_int("TOOLS_FETCH_MAX_REDIRECTS", 3, minimum=0, maximum=10)
# Private, loopback and link-local addresses are refused unless the operator allows them (an
# intranet search engine, say); the search provider's own address is the operator's and always allowed.
TOOLS_FETCH_ALLOW_PRIVATE = env_bool("TOOLS_FETCH_ALLOW_PRIVATE", False)

# --- celery --------------------------------------------------------------------------------------
# Deliberate choices, explained in docs/production.md:
# - acks late + reject on worker lost: a task whose worker dies is delivered again, so a queued
#   message is never lost; the claim (a conditional UPDATE) makes a second delivery a no-op once
#   one worker has started it, so nothing is generated twice in parallel;
# - prefetch 1: a worker takes only what it runs, so queued work stays in the broker, where
#   priorities and other workers can still reach it;
# - visibility timeout: how long an unacknowledged task waits before redelivery after a crash.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# An answer running when the broker connection drops goes on (docs/production.md, "Redis restarting").
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT_S", 120, minimum=10),
    # Redis has no native priorities: kombu keeps one list per step and reads the lowest first.
    "priority_steps": list(range(10)),
    "sep": ":",
    "queue_order_strategy": "priority",
    # kombu's own Redis clients: an idle connection is pinged before use, and connecting gives up, as
    # every other client's (chatsite/redis_clients.py). Not retry_on_timeout: its retry reconnects
    # inside kombu's own calls (a BRPOP's health check, the fanout LISTEN), on a socket kombu's poller
    # does not watch, and the worker waits silently for a reply it never reads (docs/production.md).
    "health_check_interval": REDIS_HEALTH_CHECK_S,
    "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S,
}
# kombu's Redis transport with a fix for losing Redis while tasks are unacknowledged, which otherwise
# stops a worker from consuming for good (chatsite/broker.py).
CELERY_BROKER_TRANSPORT = "chatsite.broker:Transport" if REDIS_URL else None
INFERENCE_GENERATION_TIMEOUT_S = env_int("INFERENCE_GENERATION_TIMEOUT_S", 600, minimum=10)
# A worker refreshes its heartbeat every second; one silent this long is taken for dead and its
# running generations are ended with an error the user can act on (regenerate).
INFERENCE_WORKER_HEARTBEAT_TTL_S = env_int("INFERENCE_WORKER_HEARTBEAT_TTL_S", 6, minimum=2)
# An answer computed while its message is still being checked shows nothing until the verdict
# comes. One with no verdict this long (the web process that saved the message died before judging
# it; it gives up on slow scores after 30 s) is judged by its runner instead.
INFERENCE_VERDICT_WAIT_S = env_int("INFERENCE_VERDICT_WAIT_S", 40, minimum=1)

# --- REST framework ------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON only, through the one parser that bounds nesting (chatsite/parsers.py); a form is a 415.
    "DEFAULT_PARSER_CLASSES": ["chatsite.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "chatsite.errors.api_exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "chatsite API",
    "DESCRIPTION": "OpenAI-compatible chat completions and models, and the conversations API. "
    "Authenticate with an API key: `Authorization: Bearer cs_...`.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from this server, not a CDN: the docs page works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
API_MAX_PROMPT_CHARS = env_int("API_MAX_PROMPT_CHARS", 200_000, minimum=1000)
# Images in one chat completion or one message (docs/images.md), and whether an
# `image_url` part may name an http(s) address for the service to fetch (off: data URLs only). A
# fetch refuses private, loopback and link-local addresses, follows at most
# API_IMAGE_URL_REDIRECTS redirects and reads at most the plan's image size.
API_MAX_IMAGES = env_int("API_MAX_IMAGES", 4, minimum=1, maximum=32)
API_IMAGE_URLS = env_bool("API_IMAGE_URLS", False)
API_IMAGE_URL_REDIRECTS = env_int("API_IMAGE_URL_REDIRECTS", 3, minimum=0, maximum=10)
API_IMAGE_URL_TIMEOUT_S = env_float("API_IMAGE_URL_TIMEOUT_S", 10.0, minimum=1.0)
# A /v1 request field nobody knows is a 400 naming it; off, it is ignored (docs/api.md, the field table).
OPENAI_API_STRICT_FIELDS = env_bool("OPENAI_API_STRICT_FIELDS", True)

# --- observability (docs/observability.md) ---------------------------------------------------------
# /metrics answers a request bearing this token; without one set, only requests from loopback or
# private addresses (a Prometheus beside the service), never from the public internet.
METRICS_TOKEN = env_str("METRICS_TOKEN")
# A Celery GPU worker serves its own /metrics (its engine's figures and its generations') on this
# port, bound to METRICS_WORKER_HOST; 0 serves none.
METRICS_WORKER_PORT = env_int("METRICS_WORKER_PORT", 0, minimum=0, maximum=65535)
METRICS_WORKER_HOST = env_str("METRICS_WORKER_HOST", "127.0.0.1")
# OpenTelemetry tracing, only when an OTLP endpoint is configured (observability/tracing.py).
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT")
LOG_FORMAT = env_choice("LOG_FORMAT", "plain", choices=("plain", "json"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "chatsite.logs.RequestIdFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"},
        "json": {"()": "chatsite.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["request_id"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
