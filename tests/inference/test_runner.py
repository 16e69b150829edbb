"""The generation runner on the real engine, in this process (the embedded default).

In the production topology the same runner runs inside the worker process, out of this test's reach.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from django.conf import settings

from inference.execution import runner as runner_module
from inference.execution.dispatch import local_backend
from inference.models import Generation
from inference.services import generation_from_order, generation_order
from inference.streaming.streams import replay_buffer

pytestmark = [
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


# --- a generation's order: the engine request starts before the claim --------------------------


async def _queued(alice, deployment, *, max_tokens: int = 200) -> Generation:
    # Queued without being dispatched, so only the test runs it.
    return await Generation.objects.acreate(
        user=alice,
        deployment=deployment,
        prompt_token_ids=[1, 504, 3458, 2],
        sampling={"max_tokens": max_tokens, "min_tokens": max_tokens},
    )


async def _until(condition, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_an_ordered_run_whose_claim_fails_shows_and_records_nothing(engine, alice, default_deployment):
    generation = await _queued(alice, default_deployment)
    order = generation_order(generation)
    # Another worker claimed it between the dispatch and this run.
    await Generation.objects.filter(id=generation.id).aupdate(status=Generation.Status.RUNNING, worker="elsewhere")

    await asyncio.wait_for(local_backend.runner.run(generation.id, order=order), timeout=60)

    await generation.arefresh_from_db()
    assert (generation.status, generation.worker, generation.text) == (Generation.Status.RUNNING, "elsewhere", "")
    assert await replay_buffer().read(str(generation.id), 0) == []  # nothing was shown
    assert await engine.engine_requests() == 0  # and its engine request is gone


async def test_an_ordered_run_streams_and_records_the_answer_once_claimed(engine, alice, default_deployment):
    generation = await _queued(alice, default_deployment, max_tokens=8)

    await asyncio.wait_for(local_backend.runner.run(generation.id, order=generation_order(generation)), timeout=60)

    await generation.arefresh_from_db()
    assert generation.status == Generation.Status.COMPLETE
    assert generation.worker == local_backend.runner.worker_name
    assert generation.completion_tokens == 8
    events = await replay_buffer().read(str(generation.id), 0)
    assert "".join(e.get("text", "") for e in events if e["type"] == "generation.delta") == generation.text
    assert events[-1]["type"] == "generation.done"


async def test_a_run_whose_policy_read_meets_a_dropped_connection_reads_it_again(
    engine, alice, default_deployment, monkeypatch
):
    """A database that dropped its connections (a restart, a failover) fails the first query on each
    one: the output-moderation policy is read on the way to the first text, and its read is tried
    again on a fresh connection rather than failing the answer. (SQLite drops nothing: the first
    read raises as PostgreSQL's terminated connection does.)"""
    from django.db import OperationalError

    read = runner_module.output_monitor_for
    reads = []

    def dropped_once(**kwargs):
        reads.append(kwargs)
        if len(reads) == 1:
            raise OperationalError("terminating connection due to administrator command")
        return read(**kwargs)

    monkeypatch.setattr(runner_module, "output_monitor_for", dropped_once)
    generation = await _queued(alice, default_deployment, max_tokens=8)

    # No tier in the order (a title's, a re-sent answer's): the policy is the user's, read from the row.
    order = generation_order(generation)
    await asyncio.wait_for(local_backend.runner.run(generation.id, order=order), timeout=60)

    await generation.arefresh_from_db()
    assert (generation.status, generation.error_code, generation.completion_tokens) == ("complete", "", 8)
    assert len(reads) == 2


async def test_an_answers_last_words_are_out_before_its_end_is_recorded(
    engine, alice, default_deployment, settings, monkeypatch
):
    # Coalesced so that nothing after the first text would go out on its own: without the final
    # flush, the rest would wait for the end's database write, and only then reach the reader.
    settings.INFERENCE_STREAM_COALESCE_MS = 600_000
    settings.INFERENCE_STREAM_COALESCE_CHARS = 100_000
    generation = await _queued(alice, default_deployment, max_tokens=12)
    shown_when_recorded = []
    record_end = runner_module.generation_finish

    def generation_finish(**kwargs):
        events = asyncio.run(replay_buffer().read(str(generation.id), 0))
        shown_when_recorded.append("".join(e.get("text", "") for e in events if e["type"] == "generation.delta"))
        return record_end(**kwargs)

    monkeypatch.setattr(runner_module, "generation_finish", generation_finish)

    await asyncio.wait_for(local_backend.runner.run(generation.id, order=generation_order(generation)), timeout=60)

    await generation.arefresh_from_db()
    assert generation.status == Generation.Status.COMPLETE
    assert generation.completion_tokens == 12 and generation.text
    assert shown_when_recorded == [generation.text]  # all of it, before the row said it had ended
    events = await replay_buffer().read(str(generation.id), 0)
    assert events[-1]["type"] == "generation.done"


async def test_an_ordered_run_is_moderated_under_the_tier_its_order_carries(engine, alice, default_deployment):
    from accounts.models import Tier
    from moderation.models import ModerationPolicy, PolicyRule

    # A policy on a tier Alice is not on, whose zero threshold trips on the first words checked.
    enterprise = await Tier.objects.aget(name="enterprise")
    policy = await ModerationPolicy.objects.acreate(name="enterprise tier", tier=enterprise, moderate_input=False)
    await PolicyRule.objects.acreate(policy=policy, category="violence", threshold=0.0, action="block")
    under_enterprise = await _queued(alice, default_deployment, max_tokens=8)
    under_her_own = await _queued(alice, default_deployment, max_tokens=8)

    order = generation_order(under_enterprise, tier_id=enterprise.id)
    await asyncio.wait_for(local_backend.runner.run(under_enterprise.id, order=order), timeout=60)
    await asyncio.wait_for(
        local_backend.runner.run(under_her_own.id, order=generation_order(under_her_own)), timeout=60
    )

    await under_enterprise.arefresh_from_db()
    await under_her_own.arefresh_from_db()
    assert (under_enterprise.status, under_enterprise.finish_reason) == (Generation.Status.STOPPED, "content_filter")
    assert (under_her_own.status, under_her_own.completion_tokens) == (Generation.Status.COMPLETE, 8)


@pytest.mark.engine  # vLLM's own refusal of a sampling field
async def test_an_ordered_run_the_engine_refuses_is_still_claimed_and_recorded_failed(
    engine, alice, default_deployment
):
    # Claimed beside a request the engine refuses: the failure is recorded once, with its reason.
    generation = await _queued(alice, default_deployment)
    order = generation_order(generation)
    order["sampling"] = {"max_tokens": 8, "temperature": -1.0}

    await asyncio.wait_for(local_backend.runner.run(generation.id, order=order), timeout=60)

    await generation.arefresh_from_db()
    assert (generation.status, generation.error_code) == (Generation.Status.FAILED, "engine_error")
    assert generation.worker == local_backend.runner.worker_name
    events = await replay_buffer().read(str(generation.id), 0)
    assert [e["type"] for e in events] == ["generation.error"]
    assert await engine.engine_requests() == 0


async def test_a_second_delivery_while_the_first_runs_leaves_the_first_alone(engine, alice, default_deployment):
    generation = await _queued(alice, default_deployment)
    order = generation_order(generation)
    runner = local_backend.runner
    first = asyncio.ensure_future(runner.run(generation.id, order=order))
    await _until(lambda: _has_shown_text(generation))  # claimed, and streaming

    # The same task again (a redelivery, a promotion's copy): the engine knows a request by the
    # generation's id, so a second request, or aborting it, would end the first.
    await asyncio.wait_for(runner.run(generation.id, order=order), timeout=10)

    assert not first.done()
    assert await engine.engine_requests() == 1
    assert runner.abort(str(generation.id)) is True
    await asyncio.wait_for(first, timeout=60)
    await generation.arefresh_from_db()
    assert (generation.status, generation.finish_reason) == (Generation.Status.STOPPED, "abort")
    assert 0 < generation.completion_tokens < 200


async def _has_shown_text(generation: Generation) -> bool:
    return any(e["type"] == "generation.delta" for e in await replay_buffer().read(str(generation.id), 0))


def test_an_order_describes_the_generation_it_was_made_from(alice, default_deployment):
    generation = Generation.objects.create(
        user=alice,
        deployment=default_deployment,
        prompt_token_ids=[1, 2, 3],
        sampling={"max_tokens": 5, "temperature": 0.5},
        priority=3,
        awaiting_verdict=True,
    )
    order = json.loads(json.dumps(generation_order(generation)))  # as the broker carries it

    ordered = generation_from_order(generation_id=str(generation.id), order=order)

    fields = ("user_id", "deployment_id", "prompt_token_ids", "sampling", "priority", "awaiting_verdict")
    assert {f: getattr(ordered, f) for f in fields} == {f: getattr(generation, f) for f in fields}
    assert ordered.prompt_tokens == 3
    assert str(ordered.id) == str(generation.id)
