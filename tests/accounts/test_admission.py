"""The one gate before a generation is queued: models, quotas, window caps and priority."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from accounts.models import Tier
from accounts.services import request_admit, request_limits
from billing.models import UsageRecord
from chatsite.errors import ClientError
from conversations.models import Conversation, Message
from conversations.requests import SendRequest
from conversations.services import message_send
from inference.models import Generation, ModelDeployment
from tests.accounts.conftest import run_to_end


@pytest.fixture
def big_model(db):
    return ModelDeployment.objects.create(name="big-model", model="Big", max_context=8192, default_max_tokens=4096)


def _spend(user, tokens: int, *, when=None) -> None:
    """Put `tokens` of finished usage on the user's ledger."""
    sent = message_send(user=user, request=SendRequest(content="spend"))
    finished = run_to_end(sent.generation, completion_tokens=tokens, prompt_tokens=0)
    if when is not None:
        UsageRecord.objects.filter(generation=finished).update(created_at=when)


def test_a_tier_refuses_a_model_it_does_not_include(alice, big_model):
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="hi", model="big-model"))
    assert refused.value.code == "model_not_allowed"
    assert refused.value.status == 403
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()


def test_a_users_own_tier_decides_even_where_the_default_tier_includes_the_model(alice, put_on_tier, big_model):
    put_on_tier(alice, "pro")
    Tier.objects.get(name="free").deployments.add(big_model)  # free is the default tier
    with pytest.raises(ClientError) as refused:
        request_limits(user=alice, deployment=big_model)
    assert refused.value.code == "model_not_allowed"
    assert "Pro" in refused.value.message


@pytest.mark.topology
def test_the_tier_and_its_model_list_are_read_in_one_statement(alice, default_deployment, django_assert_num_queries):
    # Every send reads both on its way to the first token.
    with django_assert_num_queries(1):
        limits = request_limits(user=alice, deployment=default_deployment)
    assert limits.tier.name == "free"


def test_a_send_with_no_plan_to_fall_back_on_is_refused_and_saves_nothing(alice):
    type(alice).objects.filter(id=alice.id).update(tier=None)
    Tier.objects.update(is_default=False)
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="hi"))
    assert (refused.value.code, refused.value.status) == ("no_tier", 503)
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()


@pytest.mark.topology
def test_a_tier_with_all_models_may_use_one_added_later(alice, put_on_tier, big_model):
    put_on_tier(alice, "enterprise")
    request_admit(user=alice, deployment=big_model, prompt_tokens=10, max_tokens=10)


@pytest.mark.topology
def test_an_admin_adding_a_model_to_a_tier_opens_it_at_once(alice, big_model):
    Tier.objects.get(name="free").deployments.add(big_model)
    request_admit(user=alice, deployment=big_model, prompt_tokens=10, max_tokens=10)


@pytest.mark.topology
def test_the_answer_is_capped_at_the_tiers_output_and_context_limits(alice, big_model, put_on_tier):
    put_on_tier(alice, "pro").deployments.add(big_model)
    Tier.objects.filter(name="pro").update(max_context=4096, max_output_tokens=1000, tokens_per_minute=None)
    admission = request_admit(user=alice, deployment=big_model, prompt_tokens=100, max_tokens=4096)
    assert admission.max_tokens == 1000
    admission = request_admit(user=alice, deployment=big_model, prompt_tokens=3500, max_tokens=4096)
    assert admission.max_tokens == 596
    with pytest.raises(ClientError) as refused:
        request_admit(user=alice, deployment=big_model, prompt_tokens=4096, max_tokens=10)
    assert refused.value.code == "context_length_exceeded"


@pytest.mark.topology
def test_a_message_uses_the_tiers_output_limit(alice):
    Tier.objects.filter(name="free").update(max_output_tokens=64)
    sent = message_send(user=alice, request=SendRequest(content="Tell me a story"))
    assert sent.generation.sampling["max_tokens"] == 64


@pytest.mark.topology
def test_the_generation_takes_its_tiers_priority(alice, bob, put_on_tier):
    put_on_tier(bob, "pro")
    free = message_send(user=alice, request=SendRequest(content="hi")).generation
    pro = message_send(user=bob, request=SendRequest(content="hi")).generation
    assert pro.priority < free.priority
    assert (free.priority, pro.priority) == (4, 2)


@pytest.mark.topology
def test_a_user_whose_daily_quota_is_spent_is_told_when_it_resets(alice):
    Tier.objects.filter(name="free").update(tokens_per_day=1000, tokens_per_minute=None)
    _spend(alice, 1000)
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="more please"))
    error = refused.value
    assert error.code == "quota_exceeded"
    assert error.status == 429
    now = timezone.now()
    midnight = (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert abs(error.retry_after - (midnight - now).total_seconds()) <= 5
    assert "resets" in error.message
    assert Message.objects.filter(content="more please").count() == 0


@pytest.mark.topology
def test_yesterdays_usage_does_not_count_against_todays_quota(alice):
    Tier.objects.filter(name="free").update(tokens_per_day=1000, tokens_per_month=None, tokens_per_minute=None)
    _spend(alice, 1000, when=timezone.now() - dt.timedelta(days=1, hours=1))
    message_send(user=alice, request=SendRequest(content="a new day"))


@pytest.mark.topology
def test_the_monthly_quota_waits_for_the_first_of_next_month(alice):
    Tier.objects.filter(name="free").update(tokens_per_day=None, tokens_per_month=2000, tokens_per_minute=None)
    _spend(alice, 2000)
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="more"))
    assert refused.value.code == "quota_exceeded"
    now = timezone.now()
    assert refused.value.retry_after > (now.replace(day=28) - now).total_seconds() or now.day >= 28


@pytest.mark.topology
def test_answers_in_flight_count_against_the_quota(alice, default_deployment):
    Tier.objects.filter(name="free").update(tokens_per_day=1000, tokens_per_minute=None, requests_per_minute=None)
    message_send(
        user=alice, request=SendRequest(content="long answer please")
    )  # queued: prompt + up to 512 tokens reserved
    reserved = Generation.objects.get()
    reserved_tokens = reserved.prompt_tokens + reserved.sampling["max_tokens"]
    admission = request_admit(user=alice, deployment=default_deployment, prompt_tokens=10, max_tokens=512)
    assert admission.max_tokens == 1000 - reserved_tokens - 10


@pytest.mark.topology
def test_failed_answers_do_not_count_against_the_quota(alice):
    Tier.objects.filter(name="free").update(tokens_per_day=1000, tokens_per_minute=None)
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    run_to_end(sent.generation, status="failed", completion_tokens=990)
    message_send(user=alice, request=SendRequest(content="again"))


def test_the_model_picker_offers_only_the_models_the_plan_includes(client, alice, bob, put_on_tier, big_model):
    client.force_login(alice)
    # The public names (orchestration.routing): `auto` picks among those the plan includes.
    assert [name for name, _ in client.get("/").context["models"]] == ["auto", "smollm2-135m"]
    put_on_tier(bob, "enterprise")
    client.force_login(bob)
    assert [name for name, _ in client.get("/").context["models"]] == ["auto", "big-model", "smollm2-135m"]
