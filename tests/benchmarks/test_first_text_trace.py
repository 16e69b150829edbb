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
    kombu = pytest.importorskip("kombu")
    monitor = RedisMonitor(redis_url)
    monitor.start()
    try:
        since = time.time()
        generation_id = str(uuid.uuid4())
        # The web process: the rate limits, then the task onto the deployment's queue (kombu, as Celery).
        assert buckets_consume([Charge("trace-user", 10, 60.0)]) is None
        with kombu.Connection(redis_url) as connection:
            queue = connection.SimpleQueue(f"gpu.{DEPLOYMENT}")
            queue.put({"generation": generation_id})
            # The worker's consumer takes it, noting an unacknowledged delivery.
            queue.get(timeout=5).ack()
            queue.close()
        # The web process releases the held answer once its message passes input moderation.
        redis.Redis.from_url(redis_url).publish(RELEASE_CHANNEL, generation_id)
        # The worker publishes the first text into the replay buffer.
        buffer = RedisReplayBuffer(redis_url, ttl_s=60)
        asyncio.run(buffer.append(generation_id, {"type": "generation.delta", "seq": 1, "text": "Hi"}))
        deadline = time.time() + 5
        while len(marks := monitor.marks(since, time.time())) < 5 and time.time() < deadline:
            time.sleep(0.02)
        assert list(marks) == ["admission", "dispatch", "received", "release", "first text"]
        assert list(marks.values()) == sorted(marks.values())
    finally:
        monitor.stop()
