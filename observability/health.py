"""Liveness and readiness: what /healthz and /readyz answer.

Readiness asks each dependency one cheap question with a short timeout (the database `SELECT 1`,
Redis and the broker `PING`, each enabled deployment's engine state, which the heartbeats already
keep), so a probe every few seconds costs the service nothing it would notice.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import connection

from inference.execution.dispatch import host_state
from inference.models import ModelDeployment

logger = logging.getLogger(__name__)

# A probe that waits longer than this for one dependency calls it down.
CHECK_TIMEOUT_S = 1.0


def _timed(check: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        detail = check() or {}
        result = {"ok": True, **detail}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    result["ms"] = round((time.perf_counter() - started) * 1000, 1)
    return result


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _redis_ping(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S)
    try:
        client.ping()
    finally:
        client.close()


def _engines() -> dict[str, Any]:
    """Each enabled generating deployment's engine state and kind (vllm, scripted); fails unless every one has a ready engine
    (an embedding deployment runs in the web process, not on an engine)."""
    deployments = list(ModelDeployment.objects.filter(is_enabled=True, task=ModelDeployment.Task.GENERATE))
    states = {d.name: host_state(d.answer_model) for d in deployments}
    # Which engine each runs on: a probe shows plainly a deployment answered by the scripted engine.
    kinds = {d.name: d.engine_kind for d in deployments}
    not_ready = sorted(name for name, state in states.items() if state != "ready")
    if not_ready:
        raise RuntimeError(f"no ready engine for {', '.join(not_ready)} ({states}; engines {kinds})")
    return {"deployments": states, "engines": kinds}


def readiness() -> dict[str, Any]:
    """{"ready": bool, "checks": {name: {"ok", "ms", ...}}}: the database, Redis and the broker when
    configured, and an engine for every enabled deployment."""
    checks = {"database": _timed(_database)}
    if settings.REDIS_URL:
        checks["redis"] = _timed(lambda: _redis_ping(settings.REDIS_URL))
    broker = settings.CELERY_BROKER_URL
    if broker and broker.startswith(("redis://", "rediss://")) and broker != settings.REDIS_URL:
        checks["broker"] = _timed(lambda: _redis_ping(broker))
    elif settings.REDIS_URL and settings.INFERENCE_BACKEND == "celery":
        checks["broker"] = {**checks["redis"], "same_as": "redis"}
    checks["engines"] = _timed(_engines)
    return {"ready": all(check["ok"] for check in checks.values()), "checks": checks}
