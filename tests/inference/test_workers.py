"""The production topology: Celery GPU workers, Redis, PostgreSQL. Runs when REDIS_URL is set."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models.functions import Now

from accounts.models import Tier
from accounts.services import user_set_tier
from conversations.models import Message
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.models import Generation, ModelDeployment
from inference.services import generation_claim
from tests.helpers.engines import CeleryWorker
from tests.helpers.sockets import drain_until_finished, next_event, open_socket, stopped_while_streaming

pytestmark = [
    pytest.mark.topology,
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
        # Before its first answer, it has loaded the classifiers that answer's sentences need.
        assert await _moderation_becomes_ready(doomed), "the worker should load moderation at boot"
        socket, _ = await open_socket(alice)
        await socket.send_json_to(
            {
                "type": "message.send",
                "model": "smollm2-doomed",
                "content": "Write a long story about a storm at sea. [write on]",
            }
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


async def test_a_warm_worker_has_frozen_its_start_up_heap(engine):
    # Otherwise a full collection walks everything vLLM, Django and the classifiers loaded: half a
    # second, with every stream on the worker's loop standing still.
    status = await engine.status_once(lambda status: status.get("heap_frozen_objects"), timeout=10)
    assert status.get("heap_frozen_objects", 0) > 100_000


async def _moderation_becomes_ready(worker: CeleryWorker, *, timeout: float = 60) -> bool:
    status = await worker.status_once(lambda status: status.get("moderation") == "ready", timeout=timeout)
    return status.get("moderation") == "ready"


async def test_a_stop_whose_publication_was_lost_lands_once_the_abort_listener_is_back(engine, alice):
    """Redis pub/sub delivers at most once: a stop published while a worker's abort listener was
    reconnecting never reaches it. The web process marks the stop in the database first, and the
    listener looks there each time it has subscribed again."""
    import redis.asyncio as aredis

    from inference.execution.workers import ABORT_LISTENER_NAME

    client = aredis.Redis.from_url(settings.REDIS_URL)

    async def listener_ids() -> set[int]:
        return {c["id"] for c in await client.client_list(_type="pubsub") if c["name"] == ABORT_LISTENER_NAME}

    async def attempt() -> tuple[tuple[list, Generation], bool]:
        socket, _ = await open_socket(alice)
        await socket.send_json_to(
            {"type": "message.send", "content": "Write a very long story about a lighthouse. [write on]"}
        )
        accepted, deltas = None, 0
        while deltas < 2:
            event = await next_event(socket)
            if event["type"] == "message.accepted":
                accepted = event
            elif event["type"] == "generation.delta":
                deltas += 1
        # The stop as the web process records it, its publication lost...
        await Generation.objects.filter(id=accepted["generation"]).aupdate(stop_requested=True)
        # ...while the listener's connection dropped (only its own: Celery's broker connections live on).
        dropped = await listener_ids()
        assert dropped, "the worker's abort listener should be subscribed, under its name"
        for listener in dropped:
            await client.client_kill_filter(_id=listener)
        deadline = time.monotonic() + 30
        while not (await listener_ids()) - dropped:
            assert time.monotonic() < deadline, "the abort listener did not come back"
            await asyncio.sleep(0.01)
        # The listener is back (and may have applied the stop already). A try whose answer had ended
        # on its own by now says nothing about the stop.
        now = await Generation.objects.aget(id=accepted["generation"])
        running = now.finished_at is None or now.finish_reason == "abort"
        events = await drain_until_finished(socket, timeout=60)
        await socket.disconnect()
        return (events, await Generation.objects.aget(id=accepted["generation"])), running

    try:
        events, generation = await stopped_while_streaming(attempt)
    finally:
        await client.aclose()
    assert (events[-1]["type"], events[-1]["status"]) == ("generation.done", "stopped"), events[-1]
    assert generation.finish_reason == "abort"


async def test_concurrent_generations_on_one_worker_share_the_engine(engine, make_user):
    """N answers at once on one worker run together in its engine, not one after another.

    Timed by the worker's own records (when it claimed each answer, when it finished it), not by when
    this process read the events: a test process that stands still for a while (the loop-stall
    warning says when) would otherwise read one answer to its end before another's first token.
    """
    users = [await database_sync_to_async(make_user)(f"user{i}") for i in range(4)]

    async def one(user) -> Generation:
        """The generation of one answer, once it is done."""
        socket, _ = await open_socket(user)
        await socket.send_json_to({"type": "message.send", "content": "Count from one to twenty in words."})
        events = await drain_until_finished(socket, timeout=120)
        assert events[-1]["type"] == "generation.done", events[-1]
        await socket.disconnect()
        accepted = next(event for event in events if event["type"] == "message.accepted")
        return await Generation.objects.aget(id=accepted["generation"])

    single = await one(users[0])
    single_rate = single.completion_tokens / (single.finished_at - single.started_at).total_seconds()
    together = await asyncio.gather(*(one(u) for u in users))
    # Served one after another, an answer would be claimed only when the one before had finished.
    # Batched in one engine, every answer is running before any of them ends.
    assert max(g.started_at for g in together) < min(g.finished_at for g in together)
    # And together they run faster than one alone (how much faster depends on the machine's cores;
    # docs/performance.md has the measured throughput at concurrency 8).
    # One after another they could not beat one stream's rate. How far above it they go depends on the
    # CPU: 1.4 times on one CI machine, 1.19 on one without bf16 instructions, so the bar is modest.
    span = (max(g.finished_at for g in together) - min(g.started_at for g in together)).total_seconds()
    assert sum(g.completion_tokens for g in together) / span > 1.1 * single_rate


# --- answers nobody runs any more ------------------------------------------------------------------


async def _running_row(alice, deployment, *, worker: str, text: str) -> Generation:
    """A generation claimed 30 s ago by `worker`, whose stream had published `text`."""
    from django.utils import timezone

    from inference.streaming.streams import StreamPublisher

    # Its text first: a reaper may end the row the moment it exists.
    generation_id = uuid.uuid4()
    publisher = StreamPublisher(generation_id, coalesce_ms=0)
    for word in text.split():
        await publisher.add_text(word + " ")
    return await Generation.objects.acreate(
        id=generation_id,
        user=alice,
        deployment=deployment,
        prompt_token_ids=[1, 2, 3],
        sampling={},
        status=Generation.Status.RUNNING,
        worker=worker,
        started_at=timezone.now() - timedelta(seconds=30),
    )


async def _until_finished(generation: Generation, *, timeout: float = 30) -> Generation:
    deadline = time.monotonic() + timeout
    while True:
        await generation.arefresh_from_db()
        if generation.is_finished or time.monotonic() > deadline:
            return generation
        await asyncio.sleep(0.2)


async def test_an_answer_whose_worker_died_is_charged_the_tokens_it_had_generated(alice, default_deployment):
    from billing.models import UsageRecord
    from inference.engine.tokenizers import count_tokens, tokenizer_for
    from inference.execution.workers import reap_once
    from inference.streaming.streams import replay_buffer

    text = "The storm rolled in over the harbour, and the boats strained at their ropes all night long."
    generation = await _running_row(alice, default_deployment, worker="gpu@gone:1", text=text)

    await reap_once()  # this process's reaper, or a worker's, ends it

    generation = await _until_finished(generation, timeout=10)
    assert (generation.status, generation.error_code) == (Generation.Status.FAILED, "worker_lost")
    assert generation.text == text + " "
    tokens = count_tokens(tokenizer_for(default_deployment.model_path), generation.text)
    assert generation.completion_tokens == tokens > 15
    record = await UsageRecord.objects.aget(generation_id=generation.id)
    assert (record.status, record.completion_tokens) == ("failed", tokens)
    events = await replay_buffer().read(str(generation.id), 0)
    assert (events[-1]["type"], events[-1]["code"]) == ("generation.error", "worker_lost")


async def test_a_dead_workers_answer_whose_stream_redis_lost_ends_on_its_socket_at_once(alice, default_deployment):
    """Redis restarted empty and the worker died: the page had seen three events the buffer no longer
    holds. The reaper's end goes past any `seq` it has seen, so the page takes it live rather than
    at the quiet stream's look at the row, seconds later."""
    from inference.execution.workers import reap_once
    from inference.streaming.streams import LOST_STREAM_SEQ

    generation = await _running_row(alice, default_deployment, worker="gpu@gone:1", text="")
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "generation.resume", "generation": str(generation.id), "after_seq": 3})
    await asyncio.sleep(0.3)  # following it, and nothing in its buffer

    await reap_once()

    event = await next_event(socket, timeout=settings.INFERENCE_STREAM_RESYNC_S - 1)
    assert (event["type"], event["code"], event["seq"]) == ("generation.error", "worker_lost", LOST_STREAM_SEQ)
    await socket.disconnect()


async def test_an_answer_its_live_worker_no_longer_runs_is_ended(engine, alice, default_deployment):
    """A runner that crashed (its end could not be recorded: the database was away for longer than
    its retries) leaves its row running on a worker whose heartbeat goes on. Before, nothing ended
    it: the conversation refused every new message, and a stop changed nothing."""
    from inference.execution.workers import reap_once

    # While the worker runs an answer, its heartbeat lists it, and the reaper leaves it alone.
    socket, _ = await open_socket(alice)
    await socket.send_json_to(
        {"type": "message.send", "content": "Write a long story about a storm at sea. [write on]"}
    )
    accepted = None
    while True:
        event = await next_event(socket)
        assert event["type"] not in ("error", "generation.error", "generation.done"), event
        if event["type"] == "message.accepted":
            accepted = event
        elif event["type"] == "generation.delta":
            break
    status = await engine.status_once(lambda status: accepted["generation"] in status.get("running", []), timeout=5)
    assert accepted["generation"] in status["running"]
    # However long ago it was claimed.
    await Generation.objects.filter(id=accepted["generation"]).aupdate(started_at=Now() - timedelta(seconds=60))
    assert await reap_once() == 0
    assert (await Generation.objects.aget(id=accepted["generation"])).status == Generation.Status.RUNNING
    await socket.send_json_to({"type": "generation.stop", "generation": accepted["generation"]})
    await drain_until_finished(socket)
    await socket.disconnect()

    # A row of this live worker's that its runner does not run: the runner is gone.
    text = "Once upon a time a lighthouse keeper counted the waves."
    orphan = await _running_row(alice, default_deployment, worker=f"{engine.node}:{engine.pid}", text=text)
    await reap_once()  # this process's reaper, or the worker's own, ends it

    orphan = await _until_finished(orphan, timeout=10)
    assert (orphan.status, orphan.error_code) == (Generation.Status.FAILED, "worker_lost")
    assert orphan.text == text + " " and orphan.completion_tokens > 5


async def test_a_worker_asked_to_stop_finishes_its_running_answers_first(alice):
    """A rolling restart: SIGTERM is Celery's warm shutdown. The worker takes no new task, and the
    answers it is writing end as they would have, on its engine, before it exits. Its engine used to
    be closed as the signal arrived, failing every answer it was writing."""
    import signal

    await ModelDeployment.objects.acreate(
        name="smollm2-leaving", **{**DEFAULT_DEPLOYMENT_FIELDS, "default_max_tokens": 80}
    )
    await database_sync_to_async(user_set_tier)(user=alice, tier=await Tier.objects.aget(name="enterprise"))
    leaving = CeleryWorker(deployments=["smollm2-leaving"], name="leaving")
    try:
        await leaving.wait_ready()
        socket, _ = await open_socket(alice)
        await socket.send_json_to(
            {"type": "message.send", "model": "smollm2-leaving", "content": "Write a long story about a storm at sea."}
        )
        deltas = 0
        while deltas < 2:
            event = await next_event(socket)
            assert event["type"] not in ("error", "generation.error", "generation.done"), event
            deltas += event["type"] == "generation.delta"
        leaving.process.send_signal(signal.SIGTERM)
        events = await drain_until_finished(socket, timeout=120)
        await socket.disconnect()
        assert (events[-1]["type"], events[-1].get("status")) == ("generation.done", "complete"), events[-1]
        exit_code = await asyncio.to_thread(leaving.process.wait, timeout=60)
    finally:
        leaving.kill()
    assert exit_code == 0
