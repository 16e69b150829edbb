"""The production topology: Celery GPU workers, Redis, PostgreSQL. Runs when REDIS_URL is set."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from accounts.models import Tier
from accounts.services import user_set_tier
from conversations.models import Message
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.models import Generation, ModelDeployment
from inference.services import generation_claim
from tests.conftest import CeleryWorker, drain_until_finished, next_event, open_socket

pytestmark = [
    pytest.mark.engine,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(settings.INFERENCE_BACKEND != "celery", reason="needs the production topology (REDIS_URL)"),
]


async def test_a_worker_killed_mid_answer_ends_the_message_with_a_clear_error(engine, alice):
    # Its own deployment and queue, served only by a worker this test kills.
    await ModelDeployment.objects.acreate(name="smollm2-doomed", **DEFAULT_DEPLOYMENT_FIELDS)
    # A plan that includes every model, new ones too.
    await database_sync_to_async(user_set_tier)(user=alice, tier=await Tier.objects.aget(name="enterprise"))
    doomed = CeleryWorker(deployments=["smollm2-doomed"], name="doomed")
    try:
        await doomed.wait_ready()
        socket, _ = await open_socket(alice)
        await socket.send_json_to(
            {"type": "message.send", "model": "smollm2-doomed", "content": "Write a long story about a storm at sea."}
        )
        accepted, deltas = None, []
        while len(deltas) < 2:
            event = await next_event(socket)
            assert event["type"] not in ("error", "generation.error", "message.blocked"), event
            if event["type"] == "message.accepted":
                accepted = event
            elif event["type"] == "generation.delta":
                deltas.append(event)
        doomed.kill()
        killed_at = time.monotonic()
        events = await drain_until_finished(socket, timeout=30)
    finally:
        doomed.kill()

    error = events[-1]
    assert error["type"] == "generation.error"
    assert error["code"] == "worker_lost"
    assert time.monotonic() - killed_at < settings.INFERENCE_WORKER_HEARTBEAT_TTL_S + 10
    generation = await Generation.objects.aget(id=accepted["generation"])
    assert generation.status == Generation.Status.FAILED
    answer = await Message.objects.aget(id=accepted["assistant_message"]["id"])
    assert answer.status == Message.Status.FAILED
    assert await Message.objects.filter(
        id=accepted["user_message"]["id"], content__startswith="Write a long story"
    ).aexists()
    # A late redelivery of the task cannot start it again.
    assert await database_sync_to_async(generation_claim)(generation_id=generation.id, worker="late") is None
    # The user can try again: the regenerated answer is queued.
    await socket.send_json_to({"type": "message.regenerate", "message": answer.id})
    regenerating = await next_event(socket)
    assert regenerating["type"] == "message.regenerating"
    await socket.disconnect()


async def test_concurrent_generations_on_one_worker_share_the_engine(engine, make_user):
    """N answers at once on one worker take far less than N times one (continuous batching)."""
    users = [await database_sync_to_async(make_user)(f"user{i}") for i in range(4)]

    async def one(user) -> float:
        socket, _ = await open_socket(user)
        started = time.monotonic()
        await socket.send_json_to({"type": "message.send", "content": "Count from one to twenty in words."})
        events = await drain_until_finished(socket)
        assert events[-1]["type"] == "generation.done"
        await socket.disconnect()
        return time.monotonic() - started, events[-1]["usage"]["completion_tokens"]

    single_time, single_tokens = await one(users[0])
    started = time.monotonic()
    results = await asyncio.gather(*(one(u) for u in users))
    together = time.monotonic() - started
    tokens = sum(t for _, t in results)
    # Compare token rates so different answer lengths do not matter. One at a time, four answers
    # would run at the single rate; batched in one engine they run well above it.
    assert tokens / together > 1.5 * (single_tokens / single_time)
