"""The ledger (charged exactly once, at the tier's price) and the pages that show it."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from accounts.models import Tier
from accounts.services import moderation_admit, user_set_tier
from billing.models import TierModelPrice, UsageRecord
from billing.services import usage_record
from conversations.requests import SendRequest
from conversations.services import message_send
from inference.models import Generation
from inference.services import generation_claim, generation_finish, generation_request_stop
from tests.accounts.conftest import run_to_end
from tests.helpers.databases import at_the_same_instant
from tests.helpers.sockets import drain_until_finished, open_socket


def test_a_finished_generation_is_charged_at_its_tiers_price(alice, put_on_tier):
    put_on_tier(alice, "pro")  # 0.0002 prompt, 0.0006 completion per 1,000 tokens
    sent = message_send(user=alice, request=SendRequest(content="What is 2 + 2?"))
    finished = run_to_end(sent.generation, prompt_tokens=1500, completion_tokens=2500)
    record = UsageRecord.objects.get()
    assert record.generation_id == finished.id
    assert record.user == alice
    assert record.tier.name == "pro"
    assert record.deployment == finished.deployment
    assert (record.prompt_tokens, record.completion_tokens) == (1500, 2500)
    assert record.prompt_price_per_1k == Decimal("0.000200")
    assert record.cost == Decimal("0.000300") + Decimal("0.001500")


def test_a_stopped_generation_is_charged_for_what_it_produced(alice, put_on_tier):
    put_on_tier(alice, "pro")
    sent = message_send(user=alice, request=SendRequest(content="Write a long story"))
    run_to_end(sent.generation, status="stopped", prompt_tokens=1000, completion_tokens=1000)
    assert UsageRecord.objects.get().cost == Decimal("0.000800")


def test_a_failed_generation_is_recorded_but_not_charged(alice, put_on_tier):
    put_on_tier(alice, "pro")
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    run_to_end(sent.generation, status="failed", prompt_tokens=1000, completion_tokens=5)
    record = UsageRecord.objects.get()
    assert record.status == "failed"
    assert record.cost == 0


def test_a_generation_stopped_before_any_engine_took_it_costs_nothing(alice, put_on_tier):
    put_on_tier(alice, "pro")
    sent = message_send(user=alice, request=SendRequest(content="never mind"))
    generation_request_stop(generation=sent.generation)
    record = UsageRecord.objects.get()
    assert (record.status, record.prompt_tokens, record.completion_tokens, record.cost) == ("stopped", 0, 0, 0)


def test_a_finish_is_five_statements_and_reads_back_none_of_the_rows_it_writes(alice, put_on_tier):
    # An answer's `done` waits for its finish, each statement a round trip: the generation comes back
    # from its own UPDATE, the tier and its price are one read, and the charge's row is inserted
    # without first looking for one and without a savepoint (the one-to-one refuses a second).
    put_on_tier(alice, "pro")
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    assert generation_claim(generation_id=sent.generation.id, worker="test") is not None
    with CaptureQueriesContext(connection) as finish:
        generation_finish(
            generation_id=sent.generation.id, status="complete", text="4", prompt_tokens=1000, completion_tokens=1000
        )
    statements = [q["sql"].lstrip() for q in finish.captured_queries]
    # The one savepoint is the finish's own transaction, nested in the test's. The reads: the tier
    # with its price, and whether the answer's conversation still waits for a title (an indexed read
    # that finds nothing once it has one; conversations.services.conversation_title_on_finish).
    verbs = sorted(sql.split()[0].upper() for sql in statements)
    assert verbs == ["INSERT", "RELEASE", "SAVEPOINT", "SELECT", "SELECT", "UPDATE", "UPDATE"]
    reads = [sql for sql in statements if sql.upper().startswith("SELECT")]
    assert all("inference_generation" not in read and "accounts_usagerecord" not in read for read in reads)
    assert sum("conversations_message" in read for read in reads) == 1
    assert UsageRecord.objects.get().cost == Decimal("0.000800")


def test_a_user_without_a_tier_of_their_own_is_charged_at_the_default_tiers_price(alice, default_deployment):
    from accounts.models import User

    User.objects.filter(id=alice.id).update(tier=None)
    TierModelPrice.objects.filter(tier__name="free").update(
        prompt_price_per_1k=Decimal("0.001"), completion_price_per_1k=Decimal("0.002")
    )
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    run_to_end(sent.generation, prompt_tokens=1000, completion_tokens=1000)
    record = UsageRecord.objects.get()
    assert record.tier.name == "free"
    assert (record.prompt_price_per_1k, record.completion_price_per_1k) == (Decimal("0.001"), Decimal("0.002"))
    assert record.cost == Decimal("0.003")


def test_a_retried_task_never_charges_twice(alice, put_on_tier):
    put_on_tier(alice, "pro")
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    finished = run_to_end(sent.generation, prompt_tokens=100, completion_tokens=100)
    # The task is delivered again: its finish is a no-op, and charging directly returns the same row.
    assert generation_finish(generation_id=finished.id, status="complete", text="again", completion_tokens=999) is None
    again = usage_record(generation=Generation.objects.get(id=finished.id))
    assert UsageRecord.objects.count() == 1
    assert again == UsageRecord.objects.get()
    assert again.completion_tokens == 100


@pytest.mark.django_db(transaction=True)
def test_two_racing_charges_for_one_generation_leave_one_row(alice):
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    run_to_end(sent.generation, completion_tokens=10)
    UsageRecord.objects.all().delete()  # as if the finish had not been charged yet
    generation = Generation.objects.select_related("user", "deployment").get(id=sent.generation.id)
    charges = at_the_same_instant(lambda: usage_record(generation=generation), times=4)
    assert len({charge.id for charge in charges}) == 1
    assert UsageRecord.objects.count() == 1


def test_prices_are_taken_per_model_and_a_model_without_a_price_is_free(alice, put_on_tier, default_deployment):
    put_on_tier(alice, "pro")
    TierModelPrice.objects.filter(tier__name="pro").delete()
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    run_to_end(sent.generation, prompt_tokens=1000, completion_tokens=1000)
    assert UsageRecord.objects.get().cost == 0


def test_an_unfinished_generation_cannot_be_charged(alice):
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    with pytest.raises(ValueError):
        usage_record(generation=sent.generation)
    assert not UsageRecord.objects.exists()


# --- pages -------------------------------------------------------------------------------------


def _finished(user, *, prompt_tokens=1000, completion_tokens=2000):
    sent = message_send(user=user, request=SendRequest(content="hi"))
    return run_to_end(sent.generation, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def test_the_usage_page_shows_this_months_tokens_and_cost(client, alice, put_on_tier):
    put_on_tier(alice, "pro")
    _finished(alice)
    _finished(alice)
    client.force_login(alice)
    response = client.get(reverse("billing:usage"))
    assert response.status_code == 200
    summary = response.context["summary"]
    assert summary.total_tokens == 6000
    assert summary.cost == Decimal("0.002800")
    assert summary.requests == 2
    assert summary.per_model[0]["deployment__name"] == "smollm2-135m"
    today = [d for d in summary.per_day if d["day"] == timezone.now().date()][0]
    assert today["tokens"] == 6000
    html = response.content.decode()
    assert 'id="total-tokens">6000<' in html
    assert "<svg" in html and "<rect" in html


def test_the_usage_page_shows_only_your_own_usage(client, alice, mallory):
    _finished(alice)
    client.force_login(mallory)
    response = client.get(reverse("billing:usage"))
    assert response.context["summary"].total_tokens == 0


def test_the_statement_is_a_csv_of_the_months_ledger(client, alice, bob, put_on_tier):
    put_on_tier(alice, "pro")
    first = _finished(alice)
    _finished(bob)
    client.force_login(alice)
    month = f"{timezone.now():%Y-%m}"
    response = client.get(reverse("billing:usage_statement"), {"month": month})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert f"statement-{month}.csv" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0][0] == "time (UTC)"
    assert len(rows) == 3  # header, alice's one generation, total
    assert rows[1][1] == str(first.id)
    assert rows[2][0] == "total"
    assert Decimal(rows[2][-1]) == Decimal("0.001400")


def test_a_statement_for_a_month_without_usage_has_only_the_total(client, alice):
    _finished(alice)
    client.force_login(alice)
    rows = list(
        csv.reader(io.StringIO(client.get(reverse("billing:usage_statement"), {"month": "2001-01"}).content.decode()))
    )
    assert [r[0] for r in rows] == ["time (UTC)", "total"]


@pytest.mark.parametrize(
    "month", ["2026-13", "2026-00", "26-11", "november", "2026-1", "9999-12", "0001-01", "2026-11-01"]
)
def test_a_bad_month_is_a_400_not_a_500(client, alice, month):
    client.force_login(alice)
    assert client.get(reverse("billing:usage_statement"), {"month": month}).status_code == 400
    assert client.get(reverse("billing:usage"), {"month": month}).status_code == 400


def test_usage_pages_need_a_login(client, db):
    assert client.get(reverse("billing:usage")).status_code == 302
    assert client.get(reverse("billing:usage_statement")).status_code == 302


def test_the_chat_page_links_to_usage_and_keys(client, alice):
    client.force_login(alice)
    html = client.get(reverse("conversations:chat")).content.decode()
    assert reverse("billing:usage") in html
    assert reverse("accounts:api_keys") in html


def test_admins_see_usage_across_users_without_a_query_per_row(admin_client, alice, bob, django_assert_max_num_queries):
    for user in (alice, bob, alice):
        _finished(user)
    with django_assert_max_num_queries(12):
        response = admin_client.get(reverse("admin:billing_usagerecord_changelist"))
    assert response.status_code == 200
    response = admin_client.get(reverse("admin:billing_usagerecord_by_user"))
    assert response.status_code == 200
    rows = {row["user__username"]: row for row in response.context["rows"]}
    assert rows["alice"]["requests"] == 2 and rows["bob"]["requests"] == 1
    assert admin_client.get(reverse("admin:billing_usagerecord_by_user"), {"month": "bad"}).status_code == 400


def test_the_admin_edits_tiers_and_never_shows_a_keys_hash(admin_client, alice):
    from accounts.models import ApiKey
    from accounts.services import api_key_create

    api_key_create(user=alice, name="k", scopes=["chat"])
    key = ApiKey.objects.get()
    page = admin_client.get(reverse("admin:accounts_apikey_change", args=[key.id])).content.decode()
    assert key.secret_hash not in page
    tier = Tier.objects.get(name="free")
    assert admin_client.get(reverse("admin:accounts_tier_change", args=[tier.id])).status_code == 200
    assert admin_client.get(reverse("admin:accounts_user_change", args=[alice.id])).status_code == 200


def test_a_missing_tier_never_undoes_a_finish(alice):
    from accounts.models import User

    sent = message_send(user=alice, request=SendRequest(content="hi"))
    User.objects.update(tier=None)
    Tier.objects.update(is_default=False)
    run_to_end(sent.generation, completion_tokens=10)
    record = UsageRecord.objects.get()
    assert record.tier is None and record.cost == 0
    assert Generation.objects.get().status == "complete"


def test_a_deleted_users_ledger_stays_numbered_by_the_old_account_and_no_longer_linked(alice, bob):
    _finished(alice)
    _finished(bob)
    alice_id = alice.id
    alice.delete()  # as the admin deletes: the ledger is kept however the account goes
    kept = UsageRecord.objects.values_list("user__username", "former_account")
    assert set(kept) == {("bob", None), (None, alice_id)}


@pytest.mark.engine
@pytest.mark.django_db(transaction=True)
async def test_a_real_answer_is_charged_once_with_the_engines_counts(engine, alice):
    pro = await Tier.objects.aget(name="pro")
    await database_sync_to_async(user_set_tier)(user=alice, tier=pro)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "Say hello in three words."})
    events = await drain_until_finished(socket)
    done = events[-1]
    assert done["type"] == "generation.done", done
    record = await UsageRecord.objects.aget()
    assert str(record.generation_id) == done["generation"]
    assert record.prompt_tokens == done["usage"]["prompt_tokens"] > 0
    assert record.completion_tokens == done["usage"]["completion_tokens"] > 0
    expected = (
        Decimal(record.prompt_tokens) * Decimal("0.0002") + Decimal(record.completion_tokens) * Decimal("0.0006")
    ) / 1000
    assert record.cost == expected.quantize(Decimal("0.000001"))
    generation = await Generation.objects.aget(id=record.generation_id)
    assert generation.priority == pro.priority
    await socket.disconnect()


def test_a_moderation_request_shows_on_the_usage_page_and_the_statement(client, alice):
    moderation_admit(user=alice, texts=["x" * 400])  # 100 tokens
    client.force_login(alice)
    page = client.get(reverse("billing:usage"))
    assert page.status_code == 200
    assert [(row["deployment__name"], row["prompt_tokens"]) for row in page.context["summary"].per_model] == [
        ("moderation", 100)
    ]
    response = client.get(reverse("billing:usage_statement"), {"month": f"{timezone.now():%Y-%m}"})
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[1][1:6] == ["", "moderation", "free", "complete", "100"]
    assert rows[2][0] == "total" and rows[2][5] == "100"
