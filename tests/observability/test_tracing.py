"""OpenTelemetry: one trace from the web request to the engine, exported over OTLP; nothing when off."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import openai
import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from accounts.services import api_key_create
from tests.observability.otlp import ReceivedSpan, otlp_receiver, tracing_installed

pytestmark = pytest.mark.skipif(not tracing_installed(), reason="requirements/otel.txt is not installed")

SERVER, PRODUCER, CONSUMER = 2, 4, 5  # OTLP's span kinds


def test_without_an_endpoint_nothing_of_opentelemetry_is_set_up():
    """Free when off: a process started without OTEL_EXPORTER_OTLP_ENDPOINT imports no instrumentation,
    no exporter and no tracing SDK, and its request handler has no tracing middleware. (redis-py 8
    imports OpenTelemetry's API and metrics SDK by itself where they are installed; it records
    nothing unless configured to.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    script = (
        "import django, json, sys; django.setup();"
        "from django.conf import settings; from observability import tracing;"
        "print(json.dumps({'modules': sorted(m for m in sys.modules if m.startswith("
        "('opentelemetry.instrumentation', 'opentelemetry.exporter', 'opentelemetry.sdk.trace'))),"
        " 'middleware': [m for m in settings.MIDDLEWARE if 'opentelemetry' in m],"
        " 'active': tracing.tracing_active()}))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "DJANGO_SETTINGS_MODULE": "chatsite.settings", "CHATSITE_LOCAL_SECRET": "1"},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen == {"modules": [], "middleware": [], "active": False}


def _ancestors(span: ReceivedSpan, spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    by_id = {s.span_id: s for s in spans}
    chain, parent = [], by_id.get(span.parent_id)
    while parent is not None:
        chain.append(parent)
        parent = by_id.get(parent.parent_id)
    return chain


@pytest.fixture
def traced_web_process(settings, monkeypatch):
    """This process traces as a web process configured with an OTLP endpoint would, to the session's
    receiver. Django's handler built its middleware when the ASGI app was imported, before tracing was
    on: it is rebuilt (as a process started with tracing on builds it after `ready()` instruments),
    and rebuilt again without tracing afterwards."""
    from chatsite.asgi import django_asgi_app
    from observability import tracing

    receiver = otlp_receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = receiver.url
    tracing.tracing_start(service="test-web")
    django_asgi_app.load_middleware(is_async=True)
    try:
        yield receiver
    finally:
        tracing.tracing_stop()
        django_asgi_app.load_middleware(is_async=True)


async def _spans_until(receiver, trace_id: str, holds, *, timeout: float = 20) -> list[ReceivedSpan]:
    """The trace's spans once `holds` is true of them (the worker exports a moment after the end)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        spans = receiver.trace(trace_id)
        if holds(spans) or asyncio.get_running_loop().time() > deadline:
            return spans
        await asyncio.sleep(0.2)


@pytest.mark.django_db(transaction=True)
async def test_an_api_call_is_one_trace_from_the_web_request_to_the_engine(
    engine, chat_server, alice, traced_web_process
):
    """Embedded default: web request → the engine's span, in one process. Production topology: web
    request → Celery publish → the worker's task → the engine's span (and its database calls), two
    processes exporting on their own, joined by the trace context in the task's headers."""
    from observability import tracing

    receiver = traced_web_process
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    client = openai.AsyncOpenAI(base_url=f"{chat_server}/v1", api_key=key, max_retries=0, timeout=120)
    raw = await client.chat.completions.with_raw_response.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
    )
    request_id = raw.headers["x-request-id"]
    await asyncio.to_thread(tracing.tracing_flush)

    def engine_spans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in spans if s.name == "generate smollm2-135m"]

    servers = [
        s
        for s in receiver.all()
        if s.kind == SERVER and s.service == "test-web" and "chat/completions" in str(s.attributes)
    ]
    assert len(servers) == 1, [(s.name, s.attributes) for s in receiver.all() if s.kind == SERVER]
    server = servers[0]
    spans = await _spans_until(receiver, server.trace_id, lambda spans: bool(engine_spans(spans)))

    [generate] = engine_spans(spans)
    assert generate.attributes["chatsite.outcome"] == "complete"
    assert generate.attributes["gen_ai.usage.output_tokens"] >= 1
    assert generate.attributes["chatsite.request_id"] == request_id
    assert server in _ancestors(generate, spans), "the engine's span is not under the web request's"

    if settings.INFERENCE_BACKEND != "celery":
        assert generate.service == "test-web"
        return
    assert generate.service == "test-gpu", "the engine's span comes from the worker that ran it"
    chain = _ancestors(generate, spans)
    publish = [s for s in chain if s.kind == PRODUCER and s.service == "test-web"]
    run = [s for s in chain if s.kind == CONSUMER and s.service == "test-gpu"]
    assert publish and run, [(s.service, s.name, s.kind) for s in chain]
    assert chain.index(run[0]) < chain.index(publish[0]), "the worker's task runs under the web's publish"
    assert any(s.service == "test-gpu" and s.attributes.get("db.system") == "postgresql" for s in spans), (
        "the worker's database calls are in the trace"
    )
