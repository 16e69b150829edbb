"""The embedded default's local processes: their heartbeats, and who ends a gone one's answers."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone

from chatsite.database import db_async
from inference.execution.dispatch import LocalBackend, local_orphans_end
from inference.heartbeats import process_heartbeat_beat
from inference.models import Generation, ProcessHeartbeat

pytestmark = pytest.mark.django_db(transaction=True)

ALIVE = "local:other-host:4242:a1b2c3d4"
SILENT = "local:other-host:1717:deadbeef"
UNKNOWN = "local:gone-host:99:00000000"


async def _running_on(worker: str, user, deployment) -> Generation:
    return await Generation.objects.acreate(
        user=user,
        deployment=deployment,
        prompt_token_ids=[1],
        sampling={},
        status=Generation.Status.RUNNING,
        worker=worker,
        started_at=timezone.now(),
    )


async def test_start_up_leaves_a_live_servers_answers_running_and_ends_a_gone_ones(alice, default_deployment):
    """Two servers on one database: the second one's start-up must not fail the first one's answers
    (it still runs them, and its waiters would never hear), only those of a process that is gone."""
    await db_async(process_heartbeat_beat)(name=ALIVE)
    await ProcessHeartbeat.objects.acreate(name=SILENT, seen_at=timezone.now() - timedelta(minutes=5))
    alive = await _running_on(ALIVE, alice, default_deployment)
    silent = await _running_on(SILENT, alice, default_deployment)
    unknown = await _running_on(UNKNOWN, alice, default_deployment)

    await LocalBackend()._recover()  # a second server starting

    assert (await Generation.objects.aget(id=alive.id)).status == Generation.Status.RUNNING
    for gone in (silent, unknown):
        gone = await Generation.objects.aget(id=gone.id)
        assert (gone.status, gone.error_code) == (Generation.Status.FAILED, "worker_lost")


async def test_a_serving_process_beats_and_ends_the_answers_of_one_that_goes_silent(
    alice, default_deployment, settings
):
    settings.INFERENCE_WORKER_HEARTBEAT_TTL_S = 1.5  # beats every 0.5 s
    backend = LocalBackend()
    await db_async(process_heartbeat_beat)(name=backend.name)  # as its start does, before it claims
    own = await _running_on(backend.name, alice, default_deployment)
    await db_async(process_heartbeat_beat)(name=ALIVE)
    other = await _running_on(ALIVE, alice, default_deployment)
    keeping_alive = asyncio.ensure_future(backend._keep_alive())
    try:
        await asyncio.sleep(0.3)
        assert (await Generation.objects.aget(id=other.id)).status == Generation.Status.RUNNING
        seen = (await ProcessHeartbeat.objects.aget(name=backend.name)).seen_at
        # The other process stops beating: within a heartbeat's TTL and a beat, its answer ends.
        for _ in range(50):
            if (await Generation.objects.aget(id=other.id)).is_finished:
                break
            await asyncio.sleep(0.1)
        assert (await Generation.objects.aget(id=other.id)).status == Generation.Status.FAILED
        assert (await ProcessHeartbeat.objects.aget(name=backend.name)).seen_at > seen
        # Its own answers it never ends (its runner has them), nor does anyone while it beats.
        assert (await Generation.objects.aget(id=own.id)).status == Generation.Status.RUNNING
    finally:
        keeping_alive.cancel()


async def test_no_process_ends_its_own_answers_or_a_celery_workers(alice, default_deployment):
    backend = LocalBackend()
    # Alive to any other server of this run (its start beats before it claims anything).
    await db_async(process_heartbeat_beat)(name=backend.name)
    own = await _running_on(backend.name, alice, default_deployment)
    celery = await _running_on("worker@gpu-1:77:77", alice, default_deployment)

    assert await local_orphans_end(own=backend.name) == 0

    assert (await Generation.objects.aget(id=own.id)).status == Generation.Status.RUNNING
    assert (await Generation.objects.aget(id=celery.id)).status == Generation.Status.RUNNING


def test_two_starts_of_one_program_are_two_processes_even_with_the_same_pid():
    """In a container a server often gets the same pid each time it starts: the restarted one must
    not take the crashed one's answers for its own."""
    assert LocalBackend().name != LocalBackend().name
