"""Settings come from the environment, and nonsense fails at start-up with a message that names it."""

from __future__ import annotations

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
    ],
)
def test_bad_values_fail_at_start_up_with_a_clear_message(env, message):
    result = start_with(env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr
