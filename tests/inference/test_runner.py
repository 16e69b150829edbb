"""The generation runner on the real engine, in this process (the embedded default).

In the production topology the same runner runs inside the worker process, out of this test's reach.
"""

from __future__ import annotations

import pytest
from django.conf import settings

from inference.dispatch import local_backend
from inference.models import Generation

pytestmark = [
    pytest.mark.engine,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(settings.INFERENCE_BACKEND != "local", reason="the runner lives in a worker process there"),
]


async def test_a_stop_heard_between_the_claim_and_the_stream_still_stops_it(engine, alice, default_deployment):
    # Queued without being dispatched, so only this test runs it.
    generation = await Generation.objects.acreate(
        user=alice,
        deployment=default_deployment,
        prompt_token_ids=[1, 504, 3458, 2],
        sampling={"max_tokens": 200, "min_tokens": 200},
    )
    runner = local_backend.runner
    # The stop reaches the runner first, while it has nothing streaming: its claim has committed
    # without seeing the stop request, and the stream has not begun.
    assert runner.abort(str(generation.id)) is False

    await runner.run(generation.id)

    await generation.arefresh_from_db()
    assert (generation.status, generation.finish_reason) == (Generation.Status.STOPPED, "abort")
    assert generation.completion_tokens < 200
    assert await engine.engine_requests() == 0
