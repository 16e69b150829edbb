"""Admission control (a bounded queue per deployment) and the order queued work is served in."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest
from channels.db import database_sync_to_async
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from accounts.models import Tier
from accounts.services import user_set_tier
from chatsite.errors import ClientError
from conversations.models import Message
from conversations.requests import SendRequest
from conversations.services import message_send
from inference.models import Generation, ModelDeployment
from inference.scheduling import effective_priority, queue_order
from inference.selectors import generation_queue_ordered
from inference.services import generation_admit
from tests.helpers.sockets import next_event, open_socket

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


@dataclass
class Request:
    name: str
    priority: int
    created_at: dt.datetime


@pytest.mark.topology
def test_a_full_queue_refuses_new_work_before_it_is_queued(alice, bob, default_deployment):
    ModelDeployment.objects.filter(id=default_deployment.id).update(max_queued=2)
    message_send(user=alice, request=SendRequest(content="one"))
    message_send(user=bob, request=SendRequest(content="two"))
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="three"))
    assert refused.value.status == 503
    assert refused.value.code == "at_capacity"
    assert refused.value.retry_after >= 1
    assert Generation.objects.count() == 2
    assert not Message.objects.filter(content="three").exists()


@pytest.mark.topology
def test_another_models_queue_does_not_fill_this_ones(alice, default_deployment):
    other = ModelDeployment.objects.create(name="big-model", model="Big", max_context=8192, default_max_tokens=4096)
    ModelDeployment.objects.filter(id=default_deployment.id).update(max_queued=1)
    Generation.objects.create(user=alice, deployment=other, prompt_token_ids=[1], sampling={})
    sent = message_send(user=alice, request=SendRequest(content="one"))
    assert sent.generation.deployment_id == default_deployment.id
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="two"))
    assert refused.value.code == "at_capacity"


@pytest.mark.topology
def test_running_work_does_not_fill_the_queue(alice, bob, default_deployment):
    ModelDeployment.objects.filter(id=default_deployment.id).update(max_queued=1)
    first = message_send(user=alice, request=SendRequest(content="one"))
    Generation.objects.filter(id=first.generation.id).update(status="running")
    message_send(user=bob, request=SendRequest(content="two"))


@pytest.mark.topology
def test_a_refusal_for_capacity_costs_no_rate_limit_budget(alice, default_deployment):
    Tier.objects.filter(name="free").update(requests_per_minute=1)
    ModelDeployment.objects.filter(id=default_deployment.id).update(max_queued=1)
    Generation.objects.create(user=alice, deployment=default_deployment, prompt_token_ids=[1], sampling={})
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="hi"))
    assert refused.value.code == "at_capacity"
    Generation.objects.update(status="complete")
    message_send(user=alice, request=SendRequest(content="hi"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
async def test_the_chat_says_the_model_is_at_capacity(alice, default_deployment):
    # A deployment this process does not host, so no local runner picks its queued work up meanwhile.
    remote = await ModelDeployment.objects.acreate(name="remote", model=default_deployment.model, max_queued=1)
    await database_sync_to_async(lambda: Tier.objects.get(name="free").deployments.add(remote))()
    await Generation.objects.acreate(user=alice, deployment=remote, prompt_token_ids=[1], sampling={})
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "hello", "model": "remote"})
    event = await next_event(socket, timeout=10)
    assert event["type"] == "error"
    assert event["code"] == "at_capacity"
    assert "at capacity" in event["message"]
    assert event["retry_after"] >= 1
    assert not await Message.objects.aexists()
    await socket.disconnect()


def test_a_pro_request_is_served_ahead_of_a_queue_of_free_ones():
    free = [Request(f"free-{i}", 4, T0 + dt.timedelta(seconds=i)) for i in range(10)]
    pro = Request("pro", 2, T0 + dt.timedelta(seconds=10))
    order = queue_order([*free, pro], now=T0 + dt.timedelta(seconds=11), aging_s=15)
    assert order[0] is pro
    assert order[1:] == free  # first come, first served within a tier


def test_a_waiting_free_request_ages_ahead_of_fresh_paid_ones():
    assert effective_priority(priority=4, waited_s=0, aging_s=15) == 4
    assert effective_priority(priority=4, waited_s=30, aging_s=15) == 2
    old_free = Request("free", 4, T0)
    fresh_pro = Request("pro", 2, T0 + dt.timedelta(seconds=31))
    order = queue_order([fresh_pro, old_free], now=T0 + dt.timedelta(seconds=31), aging_s=15)
    assert order[0] is old_free  # equal effective priority; it came first


def test_free_users_are_not_starved_by_a_steady_stream_of_paid_requests():
    """One paid request arrives and one request is served every second: the free one still gets its turn."""
    queue = [Request("free", 4, T0)]
    served = []
    for second in range(1, 120):
        now = T0 + dt.timedelta(seconds=second)
        queue.append(Request(f"pro-{second}", 2, now))
        nxt = queue_order(queue, now=now, aging_s=15)[0]
        queue.remove(nxt)
        served.append((second, nxt.name))
        if nxt.name == "free":
            break
    second, name = served[-1]
    assert name == "free"
    assert second <= (4 - 2) * 15 + 1


def test_without_aging_the_order_is_by_priority_alone():
    assert effective_priority(priority=4, waited_s=3600, aging_s=0) == 4


@pytest.mark.topology
def test_the_queue_selector_orders_a_deployments_queued_generations(alice, bob, default_deployment):
    user_set_tier(user=bob, tier=Tier.objects.get(name="pro"))
    free = [message_send(user=alice, request=SendRequest(content=f"q{i}")).generation for i in range(3)]
    pro = message_send(user=bob, request=SendRequest(content="pro")).generation
    order = [g.id for g in generation_queue_ordered(deployment=default_deployment)]
    assert order == [pro.id, *[g.id for g in free]]


def test_the_api_answers_a_full_queue_with_503_and_retry_after(alice, default_deployment):
    class SendView(APIView):
        def post(self, request):
            generation_admit(deployment=default_deployment)
            return Response({"ok": True})

    ModelDeployment.objects.filter(id=default_deployment.id).update(max_queued=1)
    default_deployment.refresh_from_db()
    Generation.objects.create(user=alice, deployment=default_deployment, prompt_token_ids=[1], sampling={})
    request = APIRequestFactory().post("/v1/send", {}, format="json")
    force_authenticate(request, user=alice)
    response = SendView.as_view()(request)
    assert response.status_code == 503
    assert response["Retry-After"] == "10"
    assert response.data["error"]["code"] == "at_capacity"


@pytest.mark.topology
def test_a_free_request_that_waited_is_promoted_in_the_broker(alice, settings):
    """Aging reaches the broker: the waiting generation's task is sent again at its aged priority."""
    import datetime as dt

    from django.utils import timezone

    from inference.models import Generation
    from inference.services import generation_promote_waiting

    settings.INFERENCE_PRIORITY_AGING_S = 15
    sent = message_send(user=alice, request=SendRequest(content="hi"))
    generation = sent.generation
    assert (generation.priority, generation.queue_priority) == (4, 4)
    now = timezone.now()
    assert generation_promote_waiting(now=now) == []
    later = now + dt.timedelta(seconds=31)
    assert generation_promote_waiting(now=later) == [(generation.id, 2)]
    assert generation_promote_waiting(now=later) == []  # promoted once per step
    generation.refresh_from_db()
    assert (generation.priority, generation.queue_priority) == (4, 2)
    assert generation_promote_waiting(now=now + dt.timedelta(seconds=300)) == [(generation.id, 0)]
    Generation.objects.filter(id=generation.id).update(status="running")
    assert generation_promote_waiting(now=now + dt.timedelta(seconds=900)) == []
