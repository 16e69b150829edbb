"""The generation services a runner retries after a dropped database connection.

A retry may find the first try's work committed (the connection broke between the commit and its
reply): the claim and the finish then recognise it as their own, so the runner runs and announces
the answer, instead of taking its own claim or end for someone else's.
"""

from __future__ import annotations

import pytest
from django.db import InterfaceError, OperationalError

from billing.models import UsageRecord
from chatsite.database import db_async, reconnecting
from inference.models import Generation
from inference.services import generation_claim, generation_finish
from tests.helpers.databases import database_connection_dropped

pytestmark = [pytest.mark.topology, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def queued(alice, default_deployment):
    return Generation.objects.create(user=alice, deployment=default_deployment, prompt_token_ids=[1, 2], sampling={})


def test_a_claims_retry_takes_a_claim_its_worker_committed_as_its_own(queued):
    assert generation_claim(generation_id=queued.id, worker="w1") is not None

    # The same worker's retry: its claim went through, only the reply was lost.
    again = generation_claim(generation_id=queued.id, worker="w1", again=True)
    assert again is not None and again.worker == "w1"
    # Anyone else's claim, retried or not, still finds it taken.
    assert generation_claim(generation_id=queued.id, worker="w2", again=True) is None
    assert generation_claim(generation_id=queued.id, worker="w1") is None


def test_a_claims_retry_does_not_take_a_generation_stopped_meanwhile(queued):
    generation_claim(generation_id=queued.id, worker="w1")
    Generation.objects.filter(id=queued.id).update(stop_requested=True)

    assert generation_claim(generation_id=queued.id, worker="w1", again=True) is None


def test_a_finishs_retry_returns_the_end_it_committed_and_charges_once(queued):
    generation_claim(generation_id=queued.id, worker="w1")
    end = {"status": "complete", "text": "Hello there.", "finish_reason": "stop", "completion_tokens": 3}
    assert generation_finish(generation_id=queued.id, **end) is not None

    again = generation_finish(generation_id=queued.id, again=True, **end)

    assert again is not None and (again.status, again.completion_tokens) == ("complete", 3)
    assert UsageRecord.objects.filter(generation_id=queued.id).count() == 1
    # An end that differs is someone else's (the reaper's, a stop's): not this call's to announce.
    assert generation_finish(generation_id=queued.id, again=True, **{**end, "status": "stopped"}) is None
    assert generation_finish(generation_id=queued.id, **end) is None


def test_a_finish_reads_back_its_row_but_not_the_prompts_token_ids(queued, django_assert_num_queries):
    generation_claim(generation_id=queued.id, worker="w1")
    finished = generation_finish(generation_id=queued.id, status="complete", text="Hi.", completion_tokens=2)

    assert (finished.status, finished.text, finished.user_id) == ("complete", "Hi.", queued.user_id)
    assert finished.get_deferred_fields() == {"prompt_token_ids"}
    with django_assert_num_queries(1):  # still there for a caller that asks
        assert finished.prompt_token_ids == [1, 2]


# --- on PostgreSQL: a connection the server dropped ------------------------------------------------


async def test_a_runners_claim_and_finish_are_retried_on_a_fresh_connection(one_database_thread, queued):
    # As the runner called them before: the claim fails, and with it the runner.
    await database_connection_dropped()
    with pytest.raises((OperationalError, InterfaceError)):
        await db_async(generation_claim)(generation_id=queued.id, worker="w1")

    # As the runner calls them now.
    await database_connection_dropped()
    claimed = await db_async(reconnecting(generation_claim, again=True))(generation_id=queued.id, worker="w1")
    assert claimed is not None and claimed.status == Generation.Status.RUNNING
    await database_connection_dropped()
    finished = await db_async(reconnecting(generation_finish, again=True))(
        generation_id=queued.id, status="complete", text="Hello there.", finish_reason="stop", completion_tokens=3
    )

    assert finished is not None
    await queued.arefresh_from_db()
    assert (queued.status, queued.text, queued.completion_tokens) == ("complete", "Hello there.", 3)
    record = await UsageRecord.objects.aget(generation_id=queued.id)
    assert (record.status, record.completion_tokens) == ("complete", 3)
