"""The first-text trace (benchmarks/first_text_trace.py) cuts a message's way at the commands the
stack leaves on Redis: these tests keep its marks in step with what the stack really sends."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

from accounts.ratelimit import Charge, buckets_consume
from benchmarks.first_text_trace import DEPLOYMENT, PARTS, RedisMonitor, _traced
from inference.execution.workers import RELEASE_CHANNEL
from inference.streaming.streams import RedisReplayBuffer


def test_a_messages_parts_add_up_to_its_added_time():
    marks = {"send": 0.0, "admission": 0.004, "dispatch": 0.011, "received": 0.013, "first text": 0.100}
    marks["client"] = 0.103
    traced = _traced("a prompt", alone_ttft=0.080, through_ttft=0.103, marks=marks)
    assert traced.added == pytest.approx(0.023)
    assert sum(traced.parts.values()) == pytest.approx(traced.added)
    assert traced.parts[PARTS[3][0]] == pytest.approx(0.007)  # the worker's: its stretch less the engine's


def test_a_message_missing_a_mark_leaves_out_only_the_parts_beside_it():
    marks = {"send": 0.0, "admission": 0.004, "received": 0.013, "first text": 0.100, "client": 0.103}
    traced = _traced("a prompt", alone_ttft=0.080, through_ttft=0.103, marks=marks)
    assert set(traced.parts) == {PARTS[0][0], PARTS[3][0], PARTS[4][0]}


@pytest.mark.redis
def test_the_marks_match_the_commands_the_stack_sends(redis_url):
    """Each command is looked for from the moment it is sent: MONITOR sees the whole server, where
    other tests' streams and tasks may run meanwhile, so marks are not compared across the steps."""
    kombu = pytest.importorskip("kombu")
    monitor = RedisMonitor(redis_url)
    monitor.start()

    def marked(name: str, since: float) -> bool:
        deadline = time.time() + 5
        while name not in monitor.marks(since, time.time()) and time.time() < deadline:
            time.sleep(0.02)
        return name in monitor.marks(since, time.time())

    try:
        generation_id = str(uuid.uuid4())
        # The web process: the rate limits, then the task onto the deployment's queue (kombu, as Celery).
        since = time.time()
        assert buckets_consume([Charge("trace-user", 10, 60.0)]) is None
        assert marked("admission", since)
        with kombu.Connection(redis_url) as connection:
            queue = connection.SimpleQueue(f"gpu.{DEPLOYMENT}")
            since = time.time()
            queue.put({"generation": generation_id})
            assert marked("dispatch", since)
            # The worker's consumer takes it, noting an unacknowledged delivery.
            since = time.time()
            queue.get(timeout=5).ack()
            assert marked("received", since)
            queue.close()
        # The web process releases the held answer once its message passes input moderation.
        since = time.time()
        redis.Redis.from_url(redis_url).publish(RELEASE_CHANNEL, generation_id)
        assert marked("release", since)
        # The worker publishes the first text into the replay buffer.
        since = time.time()
        buffer = RedisReplayBuffer(redis_url, ttl_s=60)
        asyncio.run(buffer.append(generation_id, {"type": "generation.delta", "seq": 1, "text": "Hi"}))
        assert marked("first text", since)
    finally:
        monitor.stop()
