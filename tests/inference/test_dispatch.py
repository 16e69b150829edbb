"""What a dispatch puts on the real broker (Redis), with this project's Celery settings."""

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


def test_a_dispatched_order_carries_its_prompt_but_describes_it_by_length_only():
    from chatsite.celery import app

    queue = f"gpu.order-check-{uuid.uuid4().hex[:8]}"  # no worker consumes it
    prompt = [1, 9_876_543, 504, 3458, 2]
    order = {"prompt_token_ids": prompt, "sampling": {"max_tokens": 5}, "priority": 0}
    generation_id = uuid.uuid4()

    generation_dispatch(generation_id=generation_id, queue=queue, order=order)

    with app.connection_for_read() as connection:
        simple = connection.SimpleQueue(queue)
        message = simple.get(timeout=5)
        message.ack()
        simple.close()
    args, kwargs, _ = message.payload
    assert (args, kwargs) == ([str(generation_id)], {"order": order})  # the worker gets all of it
    # What monitors and logs show of the task (its headers, its events) names none of the prompt,
    # which is the user's text in token ids.
    assert message.headers["kwargsrepr"] == "{'order': <a prompt of 5 tokens>}"
    assert "9876543" not in str(message.headers)
