"""OpenTelemetry tracing, on only when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Off, nothing of OpenTelemetry is imported and no request pays for it. On, the official
instrumentations for Django, Celery, psycopg and redis trace web → Celery → worker (the Celery
instrumentation carries the trace context in the task's headers), exported over OTLP; their
packages are in requirements/otel.txt, installed only where tracing is wanted.
"""

from __future__ import annotations

import logging
import os

from django.conf import settings

logger = logging.getLogger(__name__)

_started = False


def tracing_start_if_configured() -> bool:
    """Start tracing once per process when an OTLP endpoint is configured; True when it is on."""
    global _started
    if _started or not settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        return _started
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.instrumentation.django import DjangoInstrumentor
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.instrumentation.redis import RedisInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        logger.error(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but tracing's packages are missing (%s): "
            "pip install -r requirements/otel.txt",
            exc,
        )
        return False
    service = os.environ.get("OTEL_SERVICE_NAME", "chatsite")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    # The exporter reads OTEL_EXPORTER_OTLP_ENDPOINT (and _HEADERS, _TIMEOUT) itself.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()
    PsycopgInstrumentor().instrument()
    RedisInstrumentor().instrument()
    _started = True
    logger.info("tracing to %s as %s", settings.OTEL_EXPORTER_OTLP_ENDPOINT, service)
    return True
