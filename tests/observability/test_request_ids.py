"""Request ids: returned in X-Request-ID, and in every log line about the request's generation."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import openai
import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from accounts.services import api_key_create
from chatsite.logs import JsonFormatter, RequestIdFilter

pytestmark = pytest.mark.django_db


def test_each_response_carries_a_fresh_request_id(client):
    first, second = client.get("/healthz"), client.get("/healthz")
    assert len(first["X-Request-ID"]) == 32
    assert first["X-Request-ID"] != second["X-Request-ID"]


@pytest.mark.parametrize(
    "incoming, kept",
    [("lb-7f3a9c:req-42", True), ("x" * 129, False), ("bad id\nX-Injected: 1", False), ("", False)],
)
def test_a_sane_incoming_request_id_is_kept_and_others_replaced(client, incoming, kept):
    response = client.get("/healthz", HTTP_X_REQUEST_ID=incoming)
    assert (response["X-Request-ID"] == incoming) is kept
    assert "\n" not in response["X-Request-ID"]


def test_json_lines_carry_the_request_id():
    import json

    import chatsite.request_context as request_context

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("alice",), None)
    token = request_context.request_id.set("rid-1")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_context.request_id.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "hello alice" and line["request_id"] == "rid-1" and line["level"] == "INFO"


@pytest.mark.django_db(transaction=True)
async def test_the_request_id_reaches_the_log_lines_of_its_generation(engine, chat_server, alice, caplog):
    """Embedded default: the runner's records carry it. Production topology: the worker's log file
    (the Celery worker fixture's) has it on the lines about the generation."""
    rid = "obs-test-" + str(id(caplog))
    caplog.handler.addFilter(RequestIdFilter())
    caplog.set_level(logging.INFO)
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="r", scopes=["chat"]).key)()
    client = openai.AsyncOpenAI(base_url=f"{chat_server}/v1", api_key=key, max_retries=0, timeout=120)
    raw = await client.chat.completions.with_raw_response.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=8,
        extra_headers={"X-Request-ID": rid},
    )
    assert raw.headers["x-request-id"] == rid
    completion_id = raw.parse().id
    assert completion_id

    if settings.INFERENCE_BACKEND == "celery":
        log = Path(settings.DATA_DIR) / "test-gpu.log"
        for _ in range(50):
            lines = [line for line in log.read_text(errors="replace").splitlines() if rid in line]
            if any("generation" in line and "complete" in line for line in lines):
                break
            await asyncio.sleep(0.2)
        assert any("generation" in line and "complete" in line for line in lines), lines
        return
    about = [r for r in caplog.records if r.name.startswith("observability") and "generation" in r.getMessage()]
    assert about and all(r.request_id == rid for r in about), [(r.getMessage(), r.request_id) for r in about]
