from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import patch

import pytest
from channels.db import database_sync_to_async
from django.db import connections
from django.test import Client
from hypothesis import given
from hypothesis import settings as settings_hypothesis
from hypothesis import strategies as st
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from accounts.metering import metered
from accounts.models import ApiKey, Tier
from accounts.ratelimit import (
    Charge,
    bucket_consume,
    bucket_refund,
    buckets_consume,
    buckets_peek,
    buckets_refund,
    buckets_reset,
)
from accounts.services import api_key_create, request_admit
from chatsite.errors import ClientError
from conversations.models import Conversation, Message
from conversations.requests import SendRequest
from conversations.services import conversation_start, message_send
from inference.models import Generation
from inference.selectors import deployment_get
from tests.helpers.databases import rate_limits_clear
from tests.helpers.sockets import next_event, open_socket


@pytest.mark.topology
def test_a_bucket_admits_its_capacity_then_says_when_to_come_back(db):
    decisions = [bucket_consume(key="user:1:requests", capacity=3, period_s=60) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert 1 <= decisions[-1].retry_after <= 20  # one unit refills in 60/3 seconds


@pytest.mark.topology
def test_a_bucket_refills_continuously(db):
    for _ in range(2):
        assert bucket_consume(key="k", capacity=2, period_s=0.4).allowed
    assert not bucket_consume(key="k", capacity=2, period_s=0.4).allowed
    time.sleep(0.25)
    assert bucket_consume(key="k", capacity=2, period_s=0.4).allowed


@pytest.mark.topology
def test_a_refund_gives_units_back_but_never_above_capacity(db):
    assert bucket_consume(key="k", capacity=2, period_s=60, amount=2).allowed
    bucket_refund(key="k", capacity=2, period_s=60, amount=5)
    assert bucket_consume(key="k", capacity=2, period_s=60, amount=2).allowed
    assert not bucket_consume(key="k", capacity=2, period_s=60).allowed


@pytest.mark.topology
def test_a_request_larger_than_the_bucket_is_refused_with_a_full_refill_time(db):
    decision = bucket_consume(key="k", capacity=10, period_s=60, amount=11)
    assert not decision.allowed
    assert decision.retry_after == 60


@pytest.mark.redis
@pytest.mark.topology
def test_redis_buckets_behave_like_the_local_ones(redis_url):
    assert [bucket_consume(key="r", capacity=2, period_s=60).allowed for _ in range(3)] == [True, True, False]
    assert bucket_consume(key="r", capacity=2, period_s=60).retry_after in range(1, 31)
    bucket_refund(key="r", capacity=2, period_s=60, amount=1)
    assert bucket_consume(key="r", capacity=2, period_s=60).allowed


def _a_peek_reads_what_is_left_and_takes_nothing() -> None:
    charges = [Charge("peeked", 10, 600), Charge("never-used", 5, 60)]
    assert buckets_consume([Charge("peeked", 10, 600, 4)]) is None
    for _ in range(2):
        left, fresh = buckets_peek(charges)
        assert 6 <= left < 6.1 and fresh == 5
    assert buckets_consume([Charge("peeked", 10, 600, 6)]) is None  # the peeks took none of the six


@pytest.mark.topology
def test_a_peek_reads_what_is_left_and_takes_nothing(db):
    _a_peek_reads_what_is_left_and_takes_nothing()


@pytest.mark.topology
def test_a_peek_on_redis_reads_what_is_left_and_takes_nothing(redis_url):
    _a_peek_reads_what_is_left_and_takes_nothing()


def _a_reset_fills_a_bucket_again() -> None:
    assert bucket_consume(key="reset", capacity=2, period_s=600, amount=2).allowed
    assert not bucket_consume(key="reset", capacity=2, period_s=600).allowed
    buckets_reset(["reset", "never-used"])
    assert bucket_consume(key="reset", capacity=2, period_s=600, amount=2).allowed


@pytest.mark.topology
def test_a_reset_fills_a_bucket_again(db):
    _a_reset_fills_a_bucket_again()


@pytest.mark.redis
@pytest.mark.topology
def test_a_reset_fills_a_redis_bucket_again(redis_url):
    _a_reset_fills_a_bucket_again()


def _charges_paid_together_or_not_at_all() -> None:
    """Two buckets charged in one step: refused by either, neither is charged; refunded in one step."""
    requests, tokens = Charge("both:requests", 3, 60), Charge("both:tokens", 100, 60, 60)
    assert buckets_consume([requests, tokens]) is None
    refusal = buckets_consume([requests, tokens])  # the requests bucket has 2 left, the tokens 40
    assert refusal is not None and refusal.index == 1
    assert 1 <= refusal.retry_after <= 13  # 20 tokens at 100 a minute
    # Nothing was taken from the requests bucket by the refused step: two more fit, then none.
    assert [bucket_consume(key="both:requests", capacity=3, period_s=60).allowed for _ in range(3)] == [
        True,
        True,
        False,
    ]
    refusal = buckets_consume([Charge("both:requests", 3, 60), Charge("both:tokens", 100, 60, 10)])
    assert refusal is not None and refusal.index == 0
    assert bucket_consume(key="both:tokens", capacity=100, period_s=60, amount=40).allowed  # untouched: 40 left
    buckets_refund([Charge("both:requests", 3, 60, 3), Charge("both:tokens", 100, 60, 100)])
    assert buckets_consume([Charge("both:requests", 3, 60, 3), Charge("both:tokens", 100, 60, 100)]) is None


@pytest.mark.topology
def test_charges_paid_together_take_nothing_when_one_bucket_is_short(db):
    _charges_paid_together_or_not_at_all()


@pytest.mark.redis
@pytest.mark.topology
def test_charges_paid_together_on_redis_take_nothing_when_one_bucket_is_short(redis_url):
    _charges_paid_together_or_not_at_all()


@pytest.mark.topology
def test_a_charge_larger_than_its_bucket_is_refused_before_any_is_taken(db):
    refusal = buckets_consume([Charge("big:requests", 5, 60), Charge("big:tokens", 10, 60, 11)])
    assert refusal is not None and refusal.index == 1 and refusal.retry_after == 60
    assert [bucket_consume(key="big:requests", capacity=5, period_s=60).allowed for _ in range(6)] == [True] * 5 + [
        False
    ]


@pytest.mark.redis
@pytest.mark.topology
def test_a_concurrent_burst_on_redis_admits_at_most_the_limit_across_threads(redis_url):
    limit, attempts = 10, 64
    start = threading.Barrier(16)

    def attempt(_):
        try:
            start.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        return bucket_consume(key="burst", capacity=limit, period_s=3600).allowed

    with ThreadPoolExecutor(max_workers=16) as pool:
        admitted = sum(pool.map(attempt, range(attempts)))
    assert admitted == limit


def _burst_in_a_process(url: str, count: int, results) -> None:
    from django.conf import settings

    settings.REDIS_URL = url
    results.put(sum(bucket_consume(key="burst-proc", capacity=10, period_s=3600).allowed for _ in range(count)))


@pytest.mark.redis
@pytest.mark.topology
def test_a_concurrent_burst_on_redis_admits_at_most_the_limit_across_processes(redis_url):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    processes = [context.Process(target=_burst_in_a_process, args=(redis_url, 8, results)) for _ in range(4)]
    for process in processes:
        process.start()
    admitted = sum(results.get(timeout=30) for _ in processes)
    for process in processes:
        process.join(timeout=10)
    assert admitted == 10


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
def test_parallel_requests_from_one_user_over_the_limit_admit_at_most_the_limit(redis_url, alice, default_deployment):
    Tier.objects.filter(name="free").update(requests_per_minute=5, tokens_per_minute=None)
    outcomes = []

    def send(_):
        try:
            request_admit(user=alice, deployment=default_deployment, prompt_tokens=20, max_tokens=50)
            return "admitted"
        except ClientError as exc:
            return exc.code
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(send, range(20)))
    assert outcomes.count("admitted") == 5
    assert outcomes.count("rate_limited") == 15


@pytest.mark.topology
def test_a_free_user_over_the_request_limit_is_told_when_to_come_back(alice):
    Tier.objects.filter(name="free").update(requests_per_minute=2)
    for i in range(2):
        sent = message_send(user=alice, request=SendRequest(content=f"question {i}"))
        Generation.objects.filter(id=sent.generation.id).update(status="complete")
        Message.objects.filter(generation=sent.generation).update(status="complete")
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="one more"))
    assert refused.value.code == "rate_limited"
    assert refused.value.status == 429
    assert 1 <= refused.value.retry_after <= 30
    assert "Try again in" in refused.value.message
    assert Message.objects.filter(content="one more").count() == 0
    assert Generation.objects.count() == 2


@pytest.mark.topology
def test_the_token_limit_counts_the_prompt_and_the_answers_budget(alice, bob, default_deployment):
    Tier.objects.filter(name="free").update(requests_per_minute=None, tokens_per_minute=1000)
    admission = request_admit(user=alice, deployment=default_deployment, prompt_tokens=100, max_tokens=400)
    assert admission.max_tokens == 400
    request_admit(user=alice, deployment=default_deployment, prompt_tokens=100, max_tokens=400)
    with pytest.raises(ClientError) as refused:
        request_admit(user=alice, deployment=default_deployment, prompt_tokens=100, max_tokens=400)
    assert refused.value.code == "rate_limited"
    # Bob has his own bucket.
    request_admit(user=bob, deployment=default_deployment, prompt_tokens=100, max_tokens=400)


@pytest.mark.topology
def test_a_token_refusal_gives_back_the_request_it_counted(alice, default_deployment):
    Tier.objects.filter(name="free").update(requests_per_minute=2, tokens_per_minute=500)
    request_admit(user=alice, deployment=default_deployment, prompt_tokens=100, max_tokens=400)
    with pytest.raises(ClientError):
        request_admit(user=alice, deployment=default_deployment, prompt_tokens=100, max_tokens=400)
    Tier.objects.filter(name="free").update(tokens_per_minute=None)
    request_admit(user=alice, deployment=default_deployment, prompt_tokens=100, max_tokens=400)


@pytest.mark.topology
def test_two_keys_of_one_user_share_the_plans_buckets(alice, bob, default_deployment):
    Tier.objects.filter(name="free").update(requests_per_minute=1, tokens_per_minute=None)
    first, second = (api_key_create(user=alice, name=n, scopes=["chat"]).api_key for n in ("one", "two"))
    request_admit(user=alice, api_key=first, deployment=default_deployment, prompt_tokens=10, max_tokens=10)
    with pytest.raises(ClientError) as refused:
        request_admit(user=alice, api_key=second, deployment=default_deployment, prompt_tokens=10, max_tokens=10)
    assert refused.value.code == "rate_limited" and "your plan's limit of 1 requests a minute" in refused.value.message
    # Bob's are his own.
    request_admit(user=bob, deployment=default_deployment, prompt_tokens=10, max_tokens=10)


@pytest.mark.topology
def test_the_browser_and_a_key_share_the_plans_buckets(alice, default_deployment):
    Tier.objects.filter(name="free").update(requests_per_minute=None, tokens_per_minute=1000)
    key = api_key_create(user=alice, name="script", scopes=["chat"]).api_key
    message_send(
        user=alice, request=SendRequest(content="Hi")
    )  # the chat page's message: its prompt and a 512-token budget
    with pytest.raises(ClientError) as refused:
        request_admit(user=alice, api_key=key, deployment=default_deployment, prompt_tokens=500, max_tokens=10)
    assert refused.value.code == "rate_limited" and "tokens a minute" in refused.value.message


@pytest.mark.topology
def test_a_keys_own_cap_below_the_plan_refuses_earlier_and_only_with_that_key(alice, default_deployment):
    Tier.objects.filter(name="free").update(requests_per_minute=3, tokens_per_minute=None)
    capped = api_key_create(user=alice, name="capped", scopes=["chat"], requests_per_minute=1).api_key
    other = api_key_create(user=alice, name="other", scopes=["chat"]).api_key
    request_admit(user=alice, api_key=capped, deployment=default_deployment, prompt_tokens=10, max_tokens=10)
    with pytest.raises(ClientError) as refused:
        request_admit(user=alice, api_key=capped, deployment=default_deployment, prompt_tokens=10, max_tokens=10)
    assert "this API key's limit of 1 requests a minute" in refused.value.message
    # The refusal took nothing from the plan's bucket: two of its three are left, for the other key.
    for _ in range(2):
        request_admit(user=alice, api_key=other, deployment=default_deployment, prompt_tokens=10, max_tokens=10)
    with pytest.raises(ClientError) as refused:
        request_admit(user=alice, api_key=other, deployment=default_deployment, prompt_tokens=10, max_tokens=10)
    assert "your plan's limit of 3 requests a minute" in refused.value.message


@pytest.mark.topology
def test_a_keys_own_token_cap_caps_the_answers_budget_and_is_charged_with_the_plans(alice, default_deployment):
    Tier.objects.filter(name="free").update(requests_per_minute=None, tokens_per_minute=8000)
    key = api_key_create(user=alice, name="capped", scopes=["chat"], tokens_per_minute=300).api_key
    admission = request_admit(user=alice, api_key=key, deployment=default_deployment, prompt_tokens=100, max_tokens=400)
    assert admission.max_tokens == 200
    assert {c.key for c in admission.charges} == {f"user:{alice.id}:tokens", f"key:{key.id}:tokens"}
    assert not bucket_consume(key=f"user:{alice.id}:tokens", capacity=8000, period_s=60, amount=7801).allowed


@pytest.mark.parametrize("cap", [0, -1, 2**31, "ten", True, 1.5])
def test_a_key_cap_that_is_not_a_positive_whole_number_is_refused(alice, cap):
    with pytest.raises(ClientError) as refused:
        api_key_create(user=alice, name="bad", scopes=["chat"], requests_per_minute=cap)
    assert refused.value.param == "requests_per_minute"
    assert not ApiKey.objects.exists()


@pytest.mark.topology
def test_an_admin_tier_without_limits_is_never_rate_limited(alice, put_on_tier, default_deployment):
    put_on_tier(alice, "admin")
    for _ in range(50):
        request_admit(user=alice, deployment=default_deployment, prompt_tokens=1000, max_tokens=1000)


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
async def test_the_socket_tells_a_limited_user_when_to_come_back(alice):
    await Tier.objects.filter(name="free").aupdate(requests_per_minute=1)
    # The minute's one request is already spent (e.g. by another tab).
    await database_sync_to_async(bucket_consume)(key=f"user:{alice.id}:requests", capacity=1, period_s=60)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "second"})
    event = await next_event(socket, timeout=10)
    assert event["type"] == "error"
    assert event["code"] == "rate_limited"
    assert 1 <= event["retry_after"] <= 60
    assert "Try again in" in event["message"]
    assert not await Message.objects.aexists()
    await socket.disconnect()


class SendView(APIView):
    """Stands in for the REST API's send endpoint: it calls the same gate."""

    def post(self, request):
        request_admit(user=request.user, deployment=deployment_get(), prompt_tokens=5, max_tokens=5)
        return Response({"ok": True})


@pytest.mark.topology
def test_the_api_answers_a_rate_limit_with_429_and_retry_after_keyed_on_the_user(alice):
    Tier.objects.filter(name="free").update(requests_per_minute=1)
    responses = []
    for address in ("10.0.0.1", "10.0.0.2"):  # a client-chosen header changes nothing
        request = APIRequestFactory().post("/v1/send", {}, format="json", HTTP_X_FORWARDED_FOR=address)
        force_authenticate(request, user=alice)
        responses.append(SendView.as_view()(request))
    assert responses[0].status_code == 200
    assert responses[1].status_code == 429
    assert int(responses[1]["Retry-After"]) >= 1
    assert responses[1].data["error"]["code"] == "rate_limited"


# --- every endpoint's declared limit (accounts.metering) ---------------------------------------


@pytest.mark.topology
def test_a_declared_limit_refuses_the_request_past_it_before_the_view_runs(alice):
    Tier.objects.filter(name="free").update(other_requests_per_minute=2)
    client = Client()
    client.force_login(alice)
    answers = [client.get("/api/conversations/") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert 1 <= int(answers[-1]["Retry-After"]) <= 30
    error = answers[-1].json()["error"]
    assert (error["code"], error["type"]) == ("rate_limited", "rate_limit_error")
    assert "2 page and API requests a minute" in error["message"]
    # The bucket is the user's, whatever the view: a page is refused as well, and changes nothing.
    refused = client.post(f"/c/{conversation_start(user=alice).id}/rename/", {"title": "renamed"})
    assert refused.status_code == 429
    assert not Conversation.objects.filter(title="renamed").exists()


@pytest.mark.topology
@pytest.mark.django_db  # the sign-in page lists the admin's identity providers
def test_a_declared_limit_holds_on_a_class_based_page_and_for_visitors_by_address(monkeypatch):
    monkeypatch.setattr("accounts.services.ANONYMOUS_REQUESTS_PER_MINUTE", 2)
    client = Client()
    assert [client.get("/accounts/login/").status_code for _ in range(2)] == [200, 200]
    refused = client.get("/accounts/login/", HTTP_ACCEPT="text/html,application/xhtml+xml")
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "Too many requests" in refused.content.decode()  # a page for a person, not JSON
    assert client.get("/accounts/login/").json()["error"]["code"] == "rate_limited"
    # Another address has its own bucket.
    assert Client(REMOTE_ADDR="10.9.8.7").get("/accounts/login/").status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
async def test_a_sockets_plain_frames_are_metered_and_its_sends_by_the_admission(alice, engine_not_started):
    await Tier.objects.filter(name="free").aupdate(other_requests_per_minute=1)
    socket, _ = await open_socket(alice)
    for _ in range(2):
        await socket.send_json_to({"type": "generation.stop", "generation": str(uuid.uuid4())})
    first, second = await next_event(socket, timeout=10), await next_event(socket, timeout=10)
    assert first["code"] == "not_found"
    assert (second["code"], second["retry_after"] >= 1) == ("rate_limited", True)
    await socket.disconnect()


def test_a_declaration_naming_an_action_the_machinery_does_not_know_is_refused_at_import():
    with pytest.raises(ValueError):
        metered("requests_per_fortnight")


@settings_hypothesis(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0, 5), st.integers(1, 4)), min_size=1, max_size=60))
@pytest.mark.topology
def test_a_bucket_never_admits_more_than_its_capacity_plus_what_refilled(steps):
    """Over any run of requests, admitted units <= capacity + refill rate x elapsed time."""
    capacity, period = 5, 10.0
    clock = [1_000.0]
    rate_limits_clear()
    admitted = 0
    with patch("accounts.ratelimit.time.time", lambda: clock[0]):
        for gap, amount in steps:
            clock[0] += gap
            if bucket_consume(key="prop", capacity=capacity, period_s=period, amount=amount).allowed:
                admitted += amount
    elapsed = clock[0] - 1_000.0
    assert admitted <= capacity + capacity / period * elapsed + 1e-9
