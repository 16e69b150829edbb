"""Settings come from the environment, and nonsense fails at start-up with a message that names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_with(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "CHATSITE_LOCAL_SECRET", "INFERENCE_BACKEND"}
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['default']['ENGINE'], settings.CHANNEL_LAYERS['default']['BACKEND'], settings.INFERENCE_BACKEND)",
        ],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "chatsite.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_with_nothing_set_it_is_the_embedded_default():
    result = start_with({})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.sqlite3", "channels.layers.InMemoryChannelLayer", "local"]


def test_database_url_selects_postgresql():
    result = start_with({"DATABASE_URL": "postgres://u:p@db.example:5432/chat", "DJANGO_SECRET_KEY": "k" * 50})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "django.db.backends.postgresql"


def test_redis_url_selects_redis_and_celery():
    result = start_with({"REDIS_URL": "redis://127.0.0.1:6379/0", "DJANGO_SECRET_KEY": "k" * 50})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[1:] == ["channels_redis.pubsub.RedisPubSubChannelLayer", "celery"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DATABASE_URL": "mysql://x/y"}, "DATABASE_URL must be a URL starting with"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL must be a URL starting with"),
        ({"DJANGO_DEBUG": "maybe"}, "DJANGO_DEBUG must be a boolean"),
        ({"INFERENCE_STREAM_COALESCE_MS": "fast"}, "INFERENCE_STREAM_COALESCE_MS must be an integer"),
        ({"INFERENCE_BACKEND": "celery"}, "INFERENCE_BACKEND=celery needs REDIS_URL"),
        ({"DATABASE_URL": "postgres://u:p@db/chat"}, "DJANGO_SECRET_KEY must be set"),
        ({"DJANGO_SECRET_KEY": "short"}, "at least 32 characters"),
        ({"DJANGO_WEBSOCKET_TRUSTED_ORIGINS": "chat.example.com"}, "DJANGO_WEBSOCKET_TRUSTED_ORIGINS"),
        ({"DJANGO_CSRF_TRUSTED_ORIGINS": "https://chat.example.com/"}, "not https://chat.example.com/"),
        ({"DJANGO_TRUSTED_PROXIES": "10.0.0.1,proxy.example.com"}, "DJANGO_TRUSTED_PROXIES takes IP addresses"),
        ({"SIGNUPS_PER_ADDRESS_PER_HOUR": "-1"}, "SIGNUPS_PER_ADDRESS_PER_HOUR must be at least 0"),
        ({"BILLING_CURRENCY": "dollars"}, "BILLING_CURRENCY must be a three-letter currency code"),
    ],
)
def test_bad_values_fail_at_start_up_with_a_clear_message(env, message):
    result = start_with(env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


HTTPS_SETTINGS = (
    "HTTPS",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_SSL_REDIRECT",
    "SECURE_REFERRER_POLICY",
    "CSRF_TRUSTED_ORIGINS",
)


def https_settings(env: dict[str, str]) -> dict:
    """The HTTPS settings a process started with `env` (and no other DJANGO_ variable) ends up with."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, django; django.setup(); from django.conf import settings; "
            f"print(json.dumps({{name: getattr(settings, name) for name in {HTTPS_SETTINGS!r}}}))",
        ],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "chatsite.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_with_no_https_origin_nothing_insists_on_https():
    found = https_settings({})
    assert found["HTTPS"] is False
    assert found["SECURE_HSTS_SECONDS"] == 0
    assert found["SESSION_COOKIE_SECURE"] is False and found["CSRF_COOKIE_SECURE"] is False
    assert found["SECURE_SSL_REDIRECT"] is False
    assert found["SECURE_REFERRER_POLICY"] == "same-origin"


@pytest.mark.parametrize(
    "env",
    [
        {"DJANGO_PUBLIC_ORIGIN": "https://chat.example.com"},
        {"DJANGO_CSRF_TRUSTED_ORIGINS": "http://localhost:8000,https://chat.example.com"},
        {"DJANGO_HTTPS": "true"},
    ],
)
def test_an_https_origin_turns_on_hsts_and_secure_cookies(env):
    found = https_settings(env)
    assert found["HTTPS"] is True
    assert found["SECURE_HSTS_SECONDS"] == 365 * 24 * 3600
    assert found["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert found["SECURE_HSTS_PRELOAD"] is False
    assert found["SESSION_COOKIE_SECURE"] is True and found["CSRF_COOKIE_SECURE"] is True
    assert found["SECURE_SSL_REDIRECT"] is False  # a proxy usually redirects; opt in with DJANGO_SSL_REDIRECT


def test_the_public_origin_is_trusted_for_csrf():
    found = https_settings({"DJANGO_PUBLIC_ORIGIN": "https://Chat.Example.com/"})
    assert found["CSRF_TRUSTED_ORIGINS"] == ["https://chat.example.com"]


@pytest.mark.parametrize(
    "env",
    [
        {"DJANGO_PUBLIC_ORIGIN": "http://chat.example.com"},
        {"DJANGO_PUBLIC_ORIGIN": "https://chat.example.com", "DJANGO_DEBUG": "true"},
        {"DJANGO_PUBLIC_ORIGIN": "https://chat.example.com", "DJANGO_HTTPS": "false"},
    ],
)
def test_plain_http_debug_or_an_explicit_no_leaves_https_off(env):
    found = https_settings(env)
    assert found["HTTPS"] is False
    assert found["SECURE_HSTS_SECONDS"] == 0
    assert found["SESSION_COOKIE_SECURE"] is False


def test_each_https_setting_can_be_chosen_on_its_own():
    found = https_settings(
        {
            "DJANGO_PUBLIC_ORIGIN": "https://chat.example.com",
            "DJANGO_HSTS_SECONDS": "300",
            "DJANGO_HSTS_INCLUDE_SUBDOMAINS": "false",
            "DJANGO_HSTS_PRELOAD": "true",
            "DJANGO_SECURE_COOKIES": "false",
            "DJANGO_SSL_REDIRECT": "true",
            "DJANGO_REFERRER_POLICY": "strict-origin-when-cross-origin",
        }
    )
    assert found["SECURE_HSTS_SECONDS"] == 300
    assert found["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is False
    assert found["SECURE_HSTS_PRELOAD"] is True
    assert found["SESSION_COOKIE_SECURE"] is False and found["CSRF_COOKIE_SECURE"] is False
    assert found["SECURE_SSL_REDIRECT"] is True
    assert found["SECURE_REFERRER_POLICY"] == "strict-origin-when-cross-origin"


def test_secure_cookies_alone_still_work_without_https():
    found = https_settings({"DJANGO_SECURE_COOKIES": "true"})
    assert found["SESSION_COOKIE_SECURE"] is True and found["CSRF_COOKIE_SECURE"] is True
    assert found["SECURE_HSTS_SECONDS"] == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DJANGO_HTTPS": "sometimes"}, "DJANGO_HTTPS must be a boolean"),
        ({"DJANGO_HSTS_SECONDS": "a year"}, "DJANGO_HSTS_SECONDS must be an integer"),
        ({"DJANGO_HSTS_SECONDS": "-1"}, "DJANGO_HSTS_SECONDS must be at least 0"),
        ({"DJANGO_HSTS_INCLUDE_SUBDOMAINS": "all"}, "DJANGO_HSTS_INCLUDE_SUBDOMAINS must be a boolean"),
        ({"DJANGO_HSTS_PRELOAD": "please"}, "DJANGO_HSTS_PRELOAD must be a boolean"),
        ({"DJANGO_SSL_REDIRECT": "2"}, "DJANGO_SSL_REDIRECT must be a boolean"),
        ({"DJANGO_SECURE_COOKIES": "yes please"}, "DJANGO_SECURE_COOKIES must be a boolean"),
        ({"DJANGO_REFERRER_POLICY": "everyone"}, "DJANGO_REFERRER_POLICY must be one of"),
        ({"DJANGO_PUBLIC_ORIGIN": "chat.example.com"}, "DJANGO_PUBLIC_ORIGIN must be a URL starting with"),
        ({"DJANGO_PUBLIC_ORIGIN": "ftp://chat.example.com"}, "DJANGO_PUBLIC_ORIGIN must be a URL starting with"),
        ({"DJANGO_PUBLIC_ORIGIN": "https://chat.example.com/app"}, "DJANGO_PUBLIC_ORIGIN must be an origin"),
        ({"DJANGO_PUBLIC_ORIGIN": "https://chat.example.com:port"}, "DJANGO_PUBLIC_ORIGIN must be an origin"),
        ({"DJANGO_PUBLIC_ORIGIN": "https://"}, "DJANGO_PUBLIC_ORIGIN must be an origin"),
    ],
)
def test_bad_https_settings_fail_at_start_up_naming_the_variable(env, message):
    result = start_with(env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr
