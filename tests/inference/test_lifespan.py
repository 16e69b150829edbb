"""A web process asked to stop: what its open streams are told, and that it does not wait on them.

A real uvicorn process, started as the Procfile starts it, stopped with SIGTERM while it streams an
answer of the conversations API and one of /v1; the answers are written by the run's Celery worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from accounts.services import api_key_create
from inference.models import Generation
from tests.helpers.servers import free_port

pytestmark = [
    pytest.mark.topology,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(settings.INFERENCE_BACKEND != "celery", reason="needs the production topology (REDIS_URL)"),
]

GRACEFUL_TIMEOUT_S = 10


def _web_process(port: int) -> subprocess.Popen:
    db = settings.DATABASES["default"]
    url = (
        f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    )
    procfile = (Path(settings.BASE_DIR) / "Procfile").read_text()
    assert f"--timeout-graceful-shutdown {GRACEFUL_TIMEOUT_S}" in procfile
    log = open(Path(settings.DATA_DIR) / "web-restart.log", "wb")  # noqa: SIM115 - the process holds it
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "chatsite.asgi:application",
            "--port",
            str(port),
            "--lifespan",
            "on",
            "--ws",
            "websockets",
            "--timeout-graceful-shutdown",
            str(GRACEFUL_TIMEOUT_S),
            "--no-proxy-headers",
        ],
        env={**os.environ, "DATABASE_URL": url, "CHATSITE_LOCAL_SECRET": "1"},
        cwd=settings.BASE_DIR,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def _until_serving(client: httpx.AsyncClient, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, "the web process exited; see web-restart.log"
        try:
            await client.get("/v1/models")
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the web process did not start"
            await asyncio.sleep(0.5)


async def _sse_until_first_delta(lines, first: str) -> None:
    async for line in lines:
        if first in line:
            return
    raise AssertionError("the stream ended before its first text")


async def _rest(lines) -> list[str]:
    return [line async for line in lines if line.startswith(("data:", "event:"))]


async def test_a_web_process_asked_to_stop_ends_its_streams_at_once_and_the_answers_run_on(engine, alice):
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="t", scopes=["chat"]).key)()
    port = free_port()
    process = _web_process(port)
    headers = {"Authorization": f"Bearer {key}"}
    prompt = "Write a very long story about a lighthouse keeper and the sea. [write on]"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as client:
            await _until_serving(client, process)
            async with (
                client.stream(
                    "POST", "/api/conversations/messages/", json={"content": prompt, "client_id": str(uuid.uuid4())}
                ) as chat,
                client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={
                        "model": settings.INFERENCE_DEFAULT_DEPLOYMENT,
                        "stream": True,
                        "max_tokens": 400,
                        "messages": [{"role": "user", "content": prompt}],
                    },
                ) as completion,
            ):
                chat_lines, completion_lines = chat.aiter_lines(), completion.aiter_lines()
                await _sse_until_first_delta(chat_lines, "event: delta")
                await _sse_until_first_delta(completion_lines, '"content":"')

                asked_at = time.monotonic()
                process.send_signal(signal.SIGTERM)
                chat_rest, completion_rest = await asyncio.wait_for(
                    asyncio.gather(_rest(chat_lines), _rest(completion_lines)), timeout=GRACEFUL_TIMEOUT_S
                )
        await asyncio.to_thread(process.wait, timeout=GRACEFUL_TIMEOUT_S)
        stopped_in = time.monotonic() - asked_at
    finally:
        if process.poll() is None:
            process.kill()

    # Both streams ended at once, with a word for their clients, and the process did not wait.
    assert stopped_in < GRACEFUL_TIMEOUT_S - 3, stopped_in
    assert chat_rest[-2:-1] == ["event: error"], chat_rest[-4:]
    restarting = json.loads(chat_rest[-1].removeprefix("data: "))
    assert restarting["code"] == "server_restarting" and restarting["last_seq"] >= 1
    error = json.loads(completion_rest[-1].removeprefix("data: "))
    assert error["error"]["code"] == "server_restarting", completion_rest[-3:]
    assert "data: [DONE]" not in completion_rest

    # The conversation's answer runs on, on its worker, to be resumed elsewhere; nobody can resume
    # the /v1 stream's, so it is stopped.
    chat_generation = await Generation.objects.aget(id=restarting["generation"])
    completion_generation = await Generation.objects.exclude(id=chat_generation.id).aget(user=alice)
    await asyncio.sleep(1)
    await chat_generation.arefresh_from_db()
    assert not chat_generation.stop_requested
    assert chat_generation.status in (Generation.Status.RUNNING, Generation.Status.COMPLETE)
    await completion_generation.arefresh_from_db()
    assert completion_generation.stop_requested
