"""OpenTelemetry tracing, on only when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Off, nothing of OpenTelemetry is imported and no request pays for it. On, the official
instrumentations for Django (over ASGI), Celery, psycopg and redis trace web → Celery → worker (the
Celery instrumentation carries the trace context in the task's headers), and each generation adds a
span of its engine's work, from its claim to its end, in the trace of the request that asked for it:
the runner's task is handed the current trace with the request's id (`request_context.carry_also`).
Spans are exported over OTLP/HTTP; the packages are in requirements/otel.txt.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from django.conf import settings

import chatsite.request_context as request_context

logger = logging.getLogger(__name__)

_provider: Any = None


def tracing_active() -> bool:
    return _provider is not None


def tracing_start_if_configured() -> bool:
    """Start tracing once per process when an OTLP endpoint is configured; True when it is on."""
    if _provider is not None or not settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        return _provider is not None
    try:
        tracing_start(service=os.environ.get("OTEL_SERVICE_NAME", "chatsite"))
    except ImportError as exc:
        logger.error(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but tracing's packages are missing (%s): "
            "pip install -r requirements/otel.txt",
            exc,
        )
        return False
    logger.info("tracing to %s", settings.OTEL_EXPORTER_OTLP_ENDPOINT)
    return True


def tracing_start(*, service: str) -> None:
    """Trace this process: instrument the libraries and export to the configured OTLP endpoint."""
    global _provider
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    # The exporter reads OTEL_EXPORTER_OTLP_ENDPOINT (and _HEADERS, _TIMEOUT) itself; the provider's
    # sampler reads OTEL_TRACES_SAMPLER (parentbased_always_on unless told otherwise).
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    for instrumentor in _instrumentors():
        instrumentor.instrument(tracer_provider=provider)
    _provider = provider
    # The global provider, for code that asks OpenTelemetry for a tracer without being handed one.
    trace.set_tracer_provider(provider)
    request_context.carry_also(_trace_captured)


def tracing_stop() -> None:
    """Undo `tracing_start`: export what is pending, stop instrumenting (tests and a clean exit)."""
    global _provider
    if _provider is None:
        return
    request_context.carry_no_more(_trace_captured)
    for instrumentor in _instrumentors():
        instrumentor.uninstrument()
    _provider.shutdown()
    _provider = None


def tracing_flush(timeout_ms: int = 5000) -> None:
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def _instrumentors() -> list[Any]:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    return [DjangoInstrumentor(), CeleryInstrumentor(), PsycopgInstrumentor(), RedisInstrumentor()]


def _trace_captured() -> Callable[[], object]:
    """The caller's trace, to be made current in a carried context."""
    from opentelemetry import context

    current = context.get_current()
    return lambda: context.attach(current)


def generation_span(
    *,
    generation_id: str,
    deployment: str,
    start_s: float,
    end_s: float,
    first_token_s: float | None,
    outcome: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> None:
    """The engine's work on one generation (claim → end), in the current trace; nothing when off."""
    if _provider is None:
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    tracer = _provider.get_tracer("chatsite.inference")
    span = tracer.start_span(
        f"generate {deployment}",
        kind=SpanKind.INTERNAL,
        start_time=int(start_s * 1e9),
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "vllm",
            "gen_ai.request.model": deployment,
            "gen_ai.usage.input_tokens": prompt_tokens,
            "gen_ai.usage.output_tokens": completion_tokens,
            "chatsite.generation_id": generation_id,
            "chatsite.outcome": outcome,
            "chatsite.request_id": request_context.request_id.get(),
        },
    )
    if first_token_s is not None:
        span.add_event("first token", timestamp=int(first_token_s * 1e9))
    if outcome == "failed":
        span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=int(end_s * 1e9))
