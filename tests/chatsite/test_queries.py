"""`update_returning`: Django's own UPDATE, with the changed rows back from the same statement;
`insert_unless_conflicting`: Django's own INSERT, that inserts nothing where a unique row already is."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import UsageRecord
from chatsite.queries import insert_unless_conflicting, update_returning
from inference.models import Generation

pytestmark = pytest.mark.django_db


def _queued(user, deployment, n: int) -> list[Generation]:
    return [
        Generation.objects.create(user=user, deployment=deployment, prompt_token_ids=[1, 2], sampling={})
        for _ in range(n)
    ]


def test_the_matching_rows_change_and_come_back_as_they_now_are(alice, default_deployment):
    first, second = _queued(alice, default_deployment, 2)
    when = dt.datetime(2026, 5, 1, 12, 30, tzinfo=dt.UTC)

    rows = update_returning(
        Generation.objects.filter(id=first.id, status=Generation.Status.QUEUED),
        status=Generation.Status.RUNNING,
        worker="w1",
        started_at=when,
    )

    assert [(row.id, row.status, row.worker, row.started_at) for row in rows] == [(first.id, "running", "w1", when)]
    assert rows[0].user_id == alice.id and rows[0].prompt_token_ids == [1, 2]  # every column, converted
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.worker) == ("running", "w1")
    assert second.status == "queued"


def test_an_update_that_matches_nothing_changes_nothing_and_returns_nothing(alice, default_deployment):
    (generation,) = _queued(alice, default_deployment, 1)

    rows = update_returning(
        Generation.objects.filter(id=generation.id, status=Generation.Status.RUNNING), status=Generation.Status.COMPLETE
    )

    assert rows == []
    generation.refresh_from_db()
    assert generation.status == "queued"


def test_every_matching_row_comes_back(alice, default_deployment):
    generations = _queued(alice, default_deployment, 3)

    rows = update_returning(Generation.objects.filter(user=alice), queue_priority=7)

    assert sorted(row.id for row in rows) == sorted(g.id for g in generations)
    assert {row.queue_priority for row in rows} == {7}
    assert set(Generation.objects.values_list("queue_priority", flat=True)) == {7}


def _charge(generation: Generation, cost: str) -> UsageRecord:
    return UsageRecord(
        user_id=generation.user_id,
        generation_id=generation.id,
        deployment_id=generation.deployment_id,
        status="complete",
        cost=Decimal(cost),
    )


def test_a_row_without_a_conflict_goes_in_in_one_statement_and_gets_its_id(alice, default_deployment):
    (generation,) = _queued(alice, default_deployment, 1)
    record = _charge(generation, "0.5")

    with CaptureQueriesContext(connection) as inserting:
        assert insert_unless_conflicting(record) is True

    assert len(inserting.captured_queries) == 1
    assert record.pk is not None and not record._state.adding
    stored = UsageRecord.objects.get(pk=record.pk)
    assert (stored.generation_id, stored.cost) == (generation.id, Decimal("0.5"))


def test_a_row_that_conflicts_inserts_nothing_and_leaves_the_transaction_usable(alice, default_deployment):
    (generation,) = _queued(alice, default_deployment, 1)
    first = _charge(generation, "0.5")
    assert insert_unless_conflicting(first) is True
    second = _charge(generation, "9")

    with CaptureQueriesContext(connection) as inserting:
        assert insert_unless_conflicting(second) is False

    assert [q["sql"].split()[0] for q in inserting.captured_queries] == ["INSERT"]  # no savepoint
    assert second.pk is None
    # The test runs inside a transaction: on PostgreSQL a failed statement would have broken it.
    assert list(UsageRecord.objects.values_list("pk", "cost")) == [(first.pk, Decimal("0.5"))]
