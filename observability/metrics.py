"""The service's Prometheus metrics, and the registry /metrics reads.

Each process records what it does: a web process its requests, refusals, live sockets and streams;
the process hosting an engine (the web process in the embedded default, each GPU worker in
production) its generations' timings and tokens, and vLLM's own figures (its stat loggers register
them in this process's default registry; `engine_args: {"disable_log_stats": true}` turns them
off). Where several processes serve, set
PROMETHEUS_MULTIPROC_DIR (an empty folder per host, emptied at start): prometheus-client then keeps
values in files there and /metrics adds up every process's (docs/observability.md).

Queue depth, generations running and workers alive are the service's, not a process's: they are
read when /metrics is scraped (`ServiceCollector`), from the database and the heartbeats.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from observability.selectors import generations_by_state, workers_list

logger = logging.getLogger(__name__)

LABELS = ("deployment", "tier", "channel")

# Wide enough for a CPU (a 135M model's first token in 0.1-0.3 s, a token every 50 ms, answers of tens
# of seconds) and a GPU (tens of milliseconds to first token, a few per output token).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 20, 60)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

time_to_first_token = Histogram(
    "chatsite_time_to_first_token_seconds",
    "From the message's generation being created to its first text being shown.",
    LABELS,
    buckets=TTFT_BUCKETS,
)
time_per_output_token = Histogram(
    "chatsite_time_per_output_token_seconds",
    "From the first text to the end, divided by the tokens after the first.",
    LABELS,
    buckets=TPOT_BUCKETS,
)
end_to_end = Histogram(
    "chatsite_end_to_end_seconds",
    "From the generation being created to its end being recorded.",
    LABELS,
    buckets=E2E_BUCKETS,
)
queue_wait = Histogram(
    "chatsite_queue_wait_seconds",
    "From the generation being created to a runner claiming it.",
    LABELS,
    buckets=QUEUE_BUCKETS,
)
prompt_tokens = Counter("chatsite_prompt_tokens", "Prompt tokens of finished generations.", LABELS)
completion_tokens = Counter("chatsite_completion_tokens", "Completion tokens of finished generations.", LABELS)
requests = Counter(
    "chatsite_requests",
    "Requests by outcome: complete, stopped, content_filter, failed (with its code), rate_limited (429),"
    " refused (503), blocked (input moderation).",
    (*LABELS, "outcome", "code"),
)
moderation_actions = Counter(
    "chatsite_moderation_actions", "Moderation flags raised, by source and action.", ("source", "action")
)
tool_calls = Counter(
    "chatsite_tool_calls",
    "Calls of the tools the service runs, by tool and outcome (ok, failed, invalid, timeout, refused, withheld, not_run).",
    ("tool", "outcome"),
)
tool_seconds = Histogram(
    "chatsite_tool_duration_seconds",
    "How long the tools the service runs took, by tool.",
    ("tool",),
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 60),
)
live_sockets = Gauge("chatsite_live_sockets", "Chat sockets open in this web process.", multiprocess_mode="livesum")
live_streams = Gauge(
    "chatsite_live_streams", "HTTP answer streams (SSE) open in this web process.", multiprocess_mode="livesum"
)


def _labels(*, deployment: str, tier: str, channel: str) -> dict[str, str]:
    return {"deployment": deployment or "", "tier": tier or "", "channel": channel or ""}


def tool_call_observe(*, tool: str, outcome: str, seconds: float) -> None:
    tool_calls.labels(tool=tool, outcome=outcome).inc()
    tool_seconds.labels(tool=tool).observe(max(0.0, seconds))


def generation_observe(
    *,
    deployment: str,
    tier: str,
    channel: str,
    outcome: str,
    code: str,
    ttft_s: float | None,
    tpot_s: float | None,
    e2e_s: float | None,
    queue_wait_s: float | None,
    prompt: int,
    completion: int,
) -> None:
    """Record one finished generation's figures."""
    labels = _labels(deployment=deployment, tier=tier, channel=channel)
    for histogram, value in (
        (time_to_first_token, ttft_s),
        (time_per_output_token, tpot_s),
        (end_to_end, e2e_s),
        (queue_wait, queue_wait_s),
    ):
        if value is not None and value >= 0:
            histogram.labels(**labels).observe(value)
    prompt_tokens.labels(**labels).inc(prompt)
    completion_tokens.labels(**labels).inc(completion)
    requests.labels(**labels, outcome=outcome, code=code).inc()


def refusal_observe(*, channel: str, status: int, code: str, deployment: str = "", tier: str = "") -> str | None:
    """Record a request refused before it reached an engine (429 or 503); returns its outcome, or
    None for a status that is not a refusal (a 400 is the client's mistake, not the service's load)."""
    outcome = {429: "rate_limited", 503: "refused"}.get(status)
    if outcome is not None:
        requests.labels(**_labels(deployment=deployment, tier=tier, channel=channel), outcome=outcome, code=code).inc()
    return outcome


class ServiceCollector:
    """Gauges read at scrape time: queued generations per deployment and priority, generations
    running per deployment, and the workers alive with their engines' states."""

    def collect(self) -> Any:
        depth = GaugeMetricFamily(
            "chatsite_queue_depth", "Generations waiting for an engine.", labels=["deployment", "priority"]
        )
        running = GaugeMetricFamily("chatsite_generations_running", "Generations running.", labels=["deployment"])
        workers = GaugeMetricFamily(
            "chatsite_workers", "Workers alive, by deployment and engine state.", labels=["deployment", "state"]
        )
        try:
            counts = generations_by_state()
            for (deployment, priority), count in sorted(counts["queued"].items()):
                depth.add_metric([deployment, str(priority)], count)
            for deployment, count in sorted(counts["running"].items()):
                running.add_metric([deployment], count)
            engines: dict[tuple[str, str], int] = {}
            for worker in workers_list():
                for deployment, state in worker["engines"].items():
                    engines[(deployment, state)] = engines.get((deployment, state), 0) + 1
            for (deployment, state), count in sorted(engines.items()):
                workers.add_metric([deployment, state], count)
        except Exception:  # a scrape must answer with what it has; readiness reports the outage
            logger.warning("service gauges unavailable", exc_info=True)
        yield from (depth, running, workers)


def registry() -> CollectorRegistry:
    """What one scrape reads: every process's values under multiprocess mode, else this process's
    (vLLM's own included, which its stat logger registers in the default registry)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        collected = CollectorRegistry()
        multiprocess.MultiProcessCollector(collected)
    else:
        collected = CollectorRegistry()
        collected.register(_Default())
    collected.register(ServiceCollector())
    return collected


class _Default:
    """This process's default registry, read through another registry."""

    def collect(self) -> Any:
        yield from REGISTRY.collect()


def exposition() -> bytes:
    return generate_latest(registry())


def worker_metrics_serve() -> None:
    """A GPU worker's own /metrics (its generations' figures and its engine's), when
    METRICS_WORKER_PORT is set. Bound to METRICS_WORKER_HOST, loopback by default: for a Prometheus
    on the same host or private network, never a public address."""
    from django.conf import settings
    from prometheus_client import start_http_server

    if not settings.METRICS_WORKER_PORT:
        return
    start_http_server(settings.METRICS_WORKER_PORT, addr=settings.METRICS_WORKER_HOST)
    logger.info("worker metrics on http://%s:%s/metrics", settings.METRICS_WORKER_HOST, settings.METRICS_WORKER_PORT)
