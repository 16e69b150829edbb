"""/healthz and /readyz: alive, and ready only while what the service needs answers."""

from __future__ import annotations

import shutil

import pytest
from django.conf import settings

from inference.models import ModelDeployment
from tests.inference.test_redis_faults import RedisServer

pytestmark = pytest.mark.django_db


def test_healthz_says_the_process_is_alive(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server to start a Redis of its own")
@pytest.mark.topology
def test_readiness_fails_while_redis_is_down_and_recovers(client, settings):
    server = RedisServer()
    server.start()
    try:
        settings.REDIS_URL = server.url
        up = client.get("/readyz").json()
        assert up["checks"]["redis"]["ok"] is True
        assert up["checks"]["database"]["ok"] is True

        server.stop()
        down = client.get("/readyz")
        assert down.status_code == 503
        assert down.json()["ready"] is False
        assert down.json()["checks"]["redis"]["ok"] is False
        assert "ConnectionError" in down.json()["checks"]["redis"]["error"]

        server.start()
        assert client.get("/readyz").json()["checks"]["redis"]["ok"] is True
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
async def test_readiness_needs_a_ready_engine_for_every_enabled_deployment(engine, async_client):
    ready = await async_client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    assert ready.json()["checks"]["engines"]["deployments"][settings.INFERENCE_DEFAULT_DEPLOYMENT] == "ready"

    # A deployment enabled with no engine serving it: the service cannot take its messages.
    spare = await ModelDeployment.objects.acreate(name="spare", model="nowhere")
    not_ready = await async_client.get("/readyz")
    assert not_ready.status_code == 503
    assert "spare" in not_ready.json()["checks"]["engines"]["error"]

    spare.is_enabled = False
    await spare.asave()
    assert (await async_client.get("/readyz")).status_code == 200


def test_readiness_details_are_for_internal_callers_only(client):
    public = client.get("/readyz", REMOTE_ADDR="8.8.4.4")
    assert set(public.json()) == {"ready"}


async def _wait_ready(*args: str) -> tuple[int, str]:
    """scripts/wait_ready.py run as `make topology` and deployment scripts run it (its own process,
    while this loop goes on serving the probes)."""
    import asyncio
    import sys

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(settings.BASE_DIR / "scripts" / "wait_ready.py"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode, out.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
async def test_the_readiness_wait_says_when_the_service_can_take_messages_and_why_not(engine, chat_server):
    procfile = (settings.BASE_DIR / "Procfile").read_text()
    assert "scripts/wait_ready.py http://${HOST:-127.0.0.1}:${PORT:-8000}/readyz --watch" in procfile

    spare = await ModelDeployment.objects.acreate(name="spare", model="nowhere")
    code, out = await _wait_ready(f"{chat_server}/readyz", "--timeout", "2")
    assert code == 1, out
    assert "not ready after 2 s" in out and "no ready engine for spare" in out

    spare.is_enabled = False
    await spare.asave()
    code, out = await _wait_ready(f"{chat_server}/readyz", "--timeout", "30")
    assert code == 0, out
    assert out.startswith("ready after") and "engines" in out and "database" in out


async def test_the_readiness_wait_gives_up_on_a_service_that_does_not_answer():
    from tests.helpers.servers import free_port

    code, out = await _wait_ready(f"http://127.0.0.1:{free_port()}/readyz", "--timeout", "1")
    assert code == 1 and "unreachable" in out
