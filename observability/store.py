"""A short rolling store of the service's own figures, for the operations page.

Prometheus keeps history for those who run it; the operations page must work without one. Each
finished generation, refusal and moderation action appends one small sample to the current minute's
list (a Redis list expiring after an hour and a bit in the production topology, where every web
process and worker writes to it; this process's memory in the embedded default, where one process
does everything). Queue depth is sampled whenever the page's data is read. The page reads the last
hour and aggregates it per minute: the store holds at most what an hour of traffic sends.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import defaultdict
from typing import Any

from django.conf import settings

from chatsite.redis_clients import redis_client

logger = logging.getLogger(__name__)

WINDOW_MINUTES = 60
KEY = "chatsite:ops:{minute}"
KEPT_S = (WINDOW_MINUTES + 5) * 60
# In memory, a minute keeps at most this many samples (the embedded default serves a few people).
MEMORY_MINUTE_CAP = 20_000

_memory: dict[int, list[dict[str, Any]]] = {}
_memory_lock = threading.Lock()
_clients: dict[str, Any] = {}


def _minute(at: float) -> int:
    return int(at // 60)


def _client() -> Any:
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis_client(url)
    return _clients[url]


def sample_add(sample: dict[str, Any], *, at: float | None = None) -> None:
    """Append one sample to the current minute; a store that is down loses it, nothing else."""
    minute = _minute(at if at is not None else time.time())
    if settings.REDIS_URL:
        try:
            key = KEY.format(minute=minute)
            pipe = _client().pipeline(transaction=False)
            pipe.rpush(key, json.dumps(sample, separators=(",", ":")))
            pipe.expire(key, KEPT_S)
            pipe.execute()
        except Exception:
            logger.warning("operations sample not stored", exc_info=True)
        return
    with _memory_lock:
        samples = _memory.setdefault(minute, [])
        if len(samples) < MEMORY_MINUTE_CAP:
            samples.append(sample)
        for old in [m for m in _memory if m <= minute - WINDOW_MINUTES - 5]:
            del _memory[old]


def samples_last_hour(*, now: float | None = None) -> dict[int, list[dict[str, Any]]]:
    last = _minute(now if now is not None else time.time())
    minutes = list(range(last - WINDOW_MINUTES + 1, last + 1))
    if settings.REDIS_URL:
        pipe = _client().pipeline(transaction=False)
        for minute in minutes:
            pipe.lrange(KEY.format(minute=minute), 0, -1)
        return {m: [json.loads(raw) for raw in rows] for m, rows in zip(minutes, pipe.execute(), strict=True)}
    with _memory_lock:
        return {m: list(_memory.get(m, [])) for m in minutes}


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def series_last_hour(*, now: float | None = None) -> dict[str, Any]:
    """Per minute of the last hour: TTFT p50/p95 per deployment, output tokens per second, queue
    depth per deployment, requests by outcome and moderation actions, as columns the charts plot."""
    by_minute = samples_last_hour(now=now)
    minutes = sorted(by_minute)
    deployments = sorted(
        {s["d"] for samples in by_minute.values() for s in samples if s.get("k") in ("g", "q") and s.get("d")}
    )
    outcomes = sorted({s["o"] for samples in by_minute.values() for s in samples if s.get("k") in ("g", "r")})
    actions = sorted({f"{s['s']}:{s['a']}" for samples in by_minute.values() for s in samples if s.get("k") == "m"})
    series: dict[str, Any] = {
        "minutes": [m * 60 for m in minutes],
        "deployments": deployments,
        "ttft_p50": {d: [] for d in deployments},
        "ttft_p95": {d: [] for d in deployments},
        "queue_depth": {d: [] for d in deployments},
        "tokens_per_s": [],
        "outcomes": {o: [] for o in outcomes},
        "moderation": {a: [] for a in actions},
    }
    for minute in minutes:
        samples = by_minute[minute]
        generations = [s for s in samples if s.get("k") == "g"]
        for d in deployments:
            ttfts = [s["ttft"] for s in generations if s.get("d") == d and s.get("ttft") is not None]
            series["ttft_p50"][d].append(_percentile(ttfts, 0.5))
            series["ttft_p95"][d].append(_percentile(ttfts, 0.95))
            depths = [s["n"] for s in samples if s.get("k") == "q" and s.get("d") == d]
            series["queue_depth"][d].append(max(depths) if depths else None)
        series["tokens_per_s"].append(round(sum(s.get("tok", 0) for s in generations) / 60, 3))
        counted: dict[str, int] = defaultdict(int)
        for s in samples:
            if s.get("k") in ("g", "r"):
                counted[s["o"]] += 1
            elif s.get("k") == "m":
                counted[f"m:{s['s']}:{s['a']}"] += 1
        for o in outcomes:
            series["outcomes"][o].append(counted.get(o, 0))
        for a in actions:
            series["moderation"][a].append(counted.get(f"m:{a}", 0))
    return series
