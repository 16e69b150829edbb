"""Paid tiers first, through the real broker (Redis) with this project's Celery settings."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from inference.backend import generation_dispatch

pytestmark = [
    pytest.mark.topology,
    pytest.mark.redis,
    pytest.mark.skipif(settings.INFERENCE_BACKEND != "celery", reason="needs the production topology (REDIS_URL)"),
]


def test_the_broker_hands_out_a_pro_request_before_a_queue_of_earlier_free_ones():
    from chatsite.celery import app

    queue = f"gpu.priority-check-{uuid.uuid4().hex[:8]}"  # no worker consumes it
    free = [uuid.uuid4() for _ in range(3)]
    pro = uuid.uuid4()
    for generation_id in free:
        generation_dispatch(generation_id=generation_id, queue=queue, priority=4)  # the free tier's
    generation_dispatch(generation_id=pro, queue=queue, priority=2)  # the pro tier's, sent last

    handed_out = []
    with app.connection_for_read() as connection:
        simple = connection.SimpleQueue(queue)
        for _ in range(4):
            message = simple.get(timeout=5)
            handed_out.append(message.payload[0][0])
            message.ack()
        simple.close()
    assert handed_out == [str(pro)] + [str(g) for g in free]
