"""What the operations page and the scrape-time gauges read about the service as a whole."""

from __future__ import annotations

import json
import time
from typing import TypedDict

from django.conf import settings
from django.db.models import Count

from chatsite.parsers import JsonObject
from chatsite.redis_clients import redis_client
from inference.engine.host import engine_hosts
from inference.execution.dispatch import local_backend
from inference.execution.workers import WORKER_KEY
from inference.models import Generation


class GenerationCounts(TypedDict):
    queued: dict[tuple[str, int], int]  # by (deployment, broker priority)
    running: dict[str, int]  # by deployment


def generations_by_state() -> GenerationCounts:
    """Queued generations per (deployment, broker priority) and running ones per deployment: one
    grouped query on the indexed status column."""
    rows = (
        Generation.objects.filter(status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING])
        .values_list("status", "deployment__name", "queue_priority")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts: GenerationCounts = {"queued": {}, "running": {}}
    for status, deployment, priority, n in rows:
        if status == Generation.Status.QUEUED:
            key = (deployment, priority if priority is not None else 0)
            counts["queued"][key] = counts["queued"].get(key, 0) + n
        else:
            counts["running"][deployment] = counts["running"].get(deployment, 0) + n
    return counts


def workers_list() -> list[JsonObject]:
    """Every process hosting engines, with its heartbeat's age, its engines' states, the queues it
    consumes and what it is running: the Celery workers' heartbeats in Redis in the production
    topology, this process's own engines in the embedded default."""
    if settings.INFERENCE_BACKEND == "local":
        return [_local_worker()]

    client = redis_client(settings.REDIS_URL)
    try:
        keys = sorted(client.scan_iter(match=WORKER_KEY.format(name="*"), count=200))
        values = client.mget(keys) if keys else []
    finally:
        client.close()
    prefix = WORKER_KEY.format(name="")
    now = time.time()
    found = []
    for key, raw in zip(keys, values, strict=True):
        if raw is None:
            continue
        status = json.loads(raw)
        engines = status.get("engines", {})
        found.append(
            {
                "name": key.decode()[len(prefix) :] if isinstance(key, bytes) else key[len(prefix) :],
                "heartbeat_age_s": round(max(0.0, now - status.get("at", now)), 1),
                "engines": engines,
                "queues": [f"gpu.{name}" for name in engines],
                "active": status.get("active", 0),
                "engine_requests": status.get("engine_requests", 0),
                "moderation": status.get("moderation", ""),
            }
        )
    return found


def _local_worker() -> JsonObject:
    hosts = engine_hosts()
    runner = local_backend.runner
    return {
        "name": local_backend.name,
        "heartbeat_age_s": 0.0,
        "engines": {name: host.state.value for name, host in hosts.items()},
        "queues": ["(in process)"],
        "active": runner.active if runner is not None else 0,
        "engine_requests": sum(host.unfinished_requests() for host in hosts.values()),
        "moderation": "",
    }
