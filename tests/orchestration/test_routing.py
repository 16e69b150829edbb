"""Routing (orchestration.routing): weights, drains, stickiness, fallback, tiers and `auto`, on real
deployment rows of the default model under other names. Nothing here generates: routing is decided
before an engine sees the request, and generations are ended in the database where a test needs it."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from django.conf import settings

from accounts.models import Tier
from accounts.services import user_set_tier
from chatsite.errors import ClientError
from conversations.models import Conversation
from conversations.requests import AnswerRequest, SendRequest
from conversations.services import message_regenerate, message_send
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME
from inference.engine.host import EngineState, engine_host_for
from inference.models import Generation, ModelDeployment
from inference.selectors import deployment_route, engine_spec_for, models_listed
from inference.services import generation_claim, generation_finish
from orchestration.routing import AUTO, auto_order, route
from tests.accounts.conftest import run_to_end

CANARY = "smollm2-135m-canary"


def deployment_of_the_default_model(name: str, **fields) -> ModelDeployment:
    """Another deployment of the default model, on the default tiers' model lists."""
    deployment = ModelDeployment.objects.create(name=name, **{**DEFAULT_DEPLOYMENT_FIELDS, **fields})
    for tier in Tier.objects.filter(name__in=["free", "pro"]):
        tier.deployments.add(deployment)
    return deployment


@pytest.fixture(autouse=True)
def no_rate_limits(db):
    """These tests send more messages a minute than the free plan allows; its limits are not the point."""
    Tier.objects.filter(name="free").update(requests_per_minute=None, tokens_per_minute=None)


@pytest.fixture
def put_on_tier():
    def put(user, name: str) -> None:
        user_set_tier(user=user, tier=Tier.objects.get(name=name))

    return put


@pytest.fixture
def canary(default_deployment) -> ModelDeployment:
    """A second deployment serving the default deployment's public name."""
    return deployment_of_the_default_model(CANARY, public_name=DEFAULT_DEPLOYMENT_NAME, weight=10)


@pytest.fixture
def engines_live(default_deployment, canary, redis_engine_state):
    """Both deployments' engines ready, as their workers' heartbeats say in the production topology
    (there the session's worker serves the default deployment only, and one without a live worker is
    taken only when no live one can). The embedded default has no workers: nothing to report."""
    if settings.INFERENCE_BACKEND == "local":
        return
    for deployment in (default_deployment, canary):
        redis_engine_state(deployment, EngineState.READY, at=time.time() + 3600)


def routed_names(user, model: str, times: int, *, seed: int = 7) -> Counter:
    rng = random.Random(seed)
    return Counter(route(user=user, model=model, rng=rng).deployment.name for _ in range(times))


def fill_queue(deployment: ModelDeployment, user) -> None:
    """As many queued generations as the deployment's queue holds (rows only: nothing dispatched)."""
    for _ in range(deployment.max_queued):
        Generation.objects.create(user=user, deployment=deployment, prompt_token_ids=[1], prompt_tokens=1)


def full_canary_before(default_deployment: ModelDeployment, user) -> ModelDeployment:
    """The public name `chat` over the default deployment and a canary that routing prefers, whose
    queue `user`'s rows fill: a message for `chat` falls back to the default deployment (the one whose
    engine runs in the test session). Returns the canary."""
    ModelDeployment.objects.filter(id=default_deployment.id).update(public_name="chat", weight=1)
    canary = deployment_of_the_default_model(CANARY, public_name="chat", weight=1000, max_queued=1)
    fill_queue(canary, user)
    return canary


# --- weights and drains --------------------------------------------------------------------------


# The split is the draw's arithmetic, the same on either database; what the topology changes is
# where the engines' liveness is read (Redis), which one pair of weights proves there.
@pytest.mark.parametrize(
    ("default_weight", "canary_weight"), [(90, 10), pytest.param(50, 50, marks=pytest.mark.topology), (1, 3)]
)
def test_weights_split_a_names_traffic_as_configured(
    alice, default_deployment, canary, engines_live, default_weight, canary_weight
):
    ModelDeployment.objects.filter(id=default_deployment.id).update(weight=default_weight)
    ModelDeployment.objects.filter(id=canary.id).update(weight=canary_weight)
    counts = routed_names(alice, DEFAULT_DEPLOYMENT_NAME, 1000)
    expected = canary_weight / (default_weight + canary_weight)
    assert counts[CANARY] / 1000 == pytest.approx(expected, abs=0.04)
    assert set(counts) <= {DEFAULT_DEPLOYMENT_NAME, CANARY}


@pytest.mark.topology
def test_a_drained_deployment_takes_no_new_requests_and_its_running_answer_finishes(alice, default_deployment, canary):
    ModelDeployment.objects.filter(id=default_deployment.id).update(weight=0)
    sent = message_send(user=alice, request=SendRequest(content="Hello"))
    assert sent.generation.deployment == canary
    assert generation_claim(generation_id=sent.generation.id, worker="test") is not None  # running

    ModelDeployment.objects.filter(id=canary.id).update(weight=0)  # the admin drains it ...
    ModelDeployment.objects.filter(id=default_deployment.id).update(weight=100)
    assert routed_names(alice, DEFAULT_DEPLOYMENT_NAME, 200) == {DEFAULT_DEPLOYMENT_NAME: 200}
    # ... its running answer is untouched and ends as any other ...
    generation_finish(generation_id=sent.generation.id, status="complete", text="Hi.", completion_tokens=2)
    assert Generation.objects.get(id=sent.generation.id).status == "complete"
    # ... and its conversation moves on with its next message.
    again = message_send(user=alice, request=SendRequest(content="And again", conversation_id=sent.conversation.id))
    assert again.generation.deployment.name == DEFAULT_DEPLOYMENT_NAME
    assert Conversation.objects.get(id=sent.conversation.id).deployment.name == DEFAULT_DEPLOYMENT_NAME


def test_a_name_whose_every_deployment_is_drained_is_refused_with_retry_after(alice, default_deployment):
    ModelDeployment.objects.filter(id=default_deployment.id).update(weight=0)
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="Hello"))
    assert (refused.value.status, refused.value.code) == (503, "model_unavailable")
    assert refused.value.retry_after == settings.INFERENCE_AT_CAPACITY_RETRY_S
    assert not Conversation.objects.exists()


def test_an_unknown_model_is_not_found(alice):
    with pytest.raises(ClientError) as refused:
        route(user=alice, model="no-such-model")
    assert (refused.value.status, refused.value.code) == (404, "model_not_found")


# --- stickiness ----------------------------------------------------------------------------------


@pytest.mark.topology
def test_a_conversation_keeps_the_deployment_it_was_routed_to(alice, default_deployment, canary, engines_live):
    ModelDeployment.objects.filter(id__in=[default_deployment.id, canary.id]).update(weight=50)
    for _ in range(3):  # whichever each conversation is routed to first
        sent = message_send(user=alice, request=SendRequest(content="Hello"))
        first = sent.generation.deployment
        run_to_end(sent.generation)
        for turn in range(6):
            sent = message_send(
                user=alice, request=SendRequest(content=f"Turn {turn}", conversation_id=sent.conversation.id)
            )
            assert sent.generation.deployment == first
            assert sent.generation.routing_reason.startswith("sticky")
            run_to_end(sent.generation)
        regenerated = message_regenerate(
            user=alice, request=AnswerRequest.parse({"message": sent.assistant_message.id})
        )
        assert regenerated.generation.deployment == first


@pytest.mark.topology
def test_a_conversation_leaves_a_deployment_that_is_disabled(
    alice, default_deployment, canary, engines_live, draws_the_heaviest
):
    ModelDeployment.objects.filter(id=canary.id).update(weight=1000)
    sent = message_send(user=alice, request=SendRequest(content="Hello"))
    assert sent.generation.deployment == canary
    run_to_end(sent.generation)
    ModelDeployment.objects.filter(id=canary.id).update(is_enabled=False)
    again = message_send(user=alice, request=SendRequest(content="Again", conversation_id=sent.conversation.id))
    assert again.generation.deployment == default_deployment


# --- fallback ------------------------------------------------------------------------------------


@pytest.mark.topology
def test_a_full_queue_passes_the_request_to_the_next_deployment_and_the_answer_says_so(
    alice, bob, default_deployment, canary, draws_the_heaviest
):
    ModelDeployment.objects.filter(id=canary.id).update(weight=1000, max_queued=2)
    canary.refresh_from_db()
    fill_queue(canary, bob)
    sent = message_send(user=alice, request=SendRequest(content="Hello"))
    assert sent.generation.deployment == default_deployment
    assert "fallback" in sent.generation.routing_reason and CANARY in sent.generation.routing_reason
    # A conversation on it moves too.
    Generation.objects.filter(deployment=canary).delete()
    ModelDeployment.objects.filter(id=default_deployment.id).update(weight=0)
    moved = message_send(user=alice, request=SendRequest(content="Hi"))
    assert moved.generation.deployment == canary
    run_to_end(moved.generation)
    fill_queue(canary, bob)
    ModelDeployment.objects.filter(id=default_deployment.id).update(weight=1)
    again = message_send(user=alice, request=SendRequest(content="Again", conversation_id=moved.conversation.id))
    assert again.generation.deployment == default_deployment


@pytest.mark.topology
def test_a_failed_engine_passes_the_request_to_the_next_deployment(
    alice, default_deployment, canary, redis_engine_state
):
    ModelDeployment.objects.filter(id__in=[default_deployment.id, canary.id]).update(weight=1)
    ModelDeployment.objects.filter(id=canary.id).update(weight=1000)
    redis_engine_state(ModelDeployment.objects.get(id=canary.id), EngineState.FAILED)
    routed = route(user=alice, model=DEFAULT_DEPLOYMENT_NAME, rng=random.Random(0))  # draws the canary
    assert routed.deployment == default_deployment
    assert "failed engine" in routed.reason


@pytest.mark.topology
def test_when_no_deployment_can_take_it_the_request_is_refused_with_retry_after(alice, bob, default_deployment, canary):
    ModelDeployment.objects.filter(id__in=[default_deployment.id, canary.id]).update(max_queued=1)
    for deployment in ModelDeployment.objects.filter(id__in=[default_deployment.id, canary.id]):
        fill_queue(deployment, bob)
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="Hello"))
    assert (refused.value.status, refused.value.code) == (503, "at_capacity")
    assert refused.value.retry_after == settings.INFERENCE_AT_CAPACITY_RETRY_S
    assert not Conversation.objects.exists()


# --- tiers ---------------------------------------------------------------------------------------


@pytest.mark.topology
def test_one_name_maps_to_a_small_model_on_free_and_a_larger_one_on_pro(alice, bob, put_on_tier, default_deployment):
    small = deployment_of_the_default_model("chat-small", public_name="chat", max_context=1024)
    large = deployment_of_the_default_model("chat-large", public_name="chat")
    Tier.objects.get(name="free").deployments.remove(large)
    Tier.objects.get(name="pro").deployments.remove(small)
    put_on_tier(bob, "pro")
    assert routed_names(alice, "chat", 50) == {"chat-small": 50}
    assert routed_names(bob, "chat", 50) == {"chat-large": 50}
    sent = message_send(user=bob, request=SendRequest(content="Hello", model="chat"))
    assert sent.generation.deployment == large
    assert sent.conversation.model == "chat"
    # The model lists show the name once.
    listed = [name for name, _ in models_listed(list(ModelDeployment.objects.order_by("name")))]
    assert listed.count("chat") == 1 and AUTO in listed


def test_a_name_the_plan_has_no_deployment_of_is_refused(alice, default_deployment):
    deployment_of_the_default_model("chat-a", public_name="chat")
    deployment_of_the_default_model("chat-b", public_name="chat")
    Tier.objects.get(name="free").deployments.remove(*ModelDeployment.objects.filter(public_name="chat"))
    with pytest.raises(ClientError) as refused:
        route(user=alice, model="chat")
    assert (refused.value.status, refused.value.code) == (403, "model_not_allowed")


# --- auto ----------------------------------------------------------------------------------------


@pytest.fixture
def windows(db, default_deployment) -> dict[str, ModelDeployment]:
    """Three deployments of the default model with windows of 1024, 2048 and 4096 tokens."""
    deployments = {
        "mini": deployment_of_the_default_model("mini", max_context=1024),
        "midi": deployment_of_the_default_model("midi", max_context=2048),
        "maxi": deployment_of_the_default_model("maxi", max_context=4096),
    }
    ModelDeployment.objects.filter(id=default_deployment.id).update(is_enabled=False)
    for deployment in deployments.values():
        deployment.queued_now = 0
    return deployments


def auto_first(deployments, *, tokens: int, max_context: int | None = None, sticky=None) -> tuple[str, str]:
    ordered = auto_order(list(deployments), max_context=max_context, prompt_tokens=lambda d: tokens, sticky=sticky)
    return ordered[0][0].name, ordered[0][1]


def test_auto_takes_the_smallest_window_the_prompt_fits(windows):
    assert auto_first(windows.values(), tokens=100)[0] == "mini"
    assert auto_first(windows.values(), tokens=1500)[0] == "midi"
    assert auto_first(windows.values(), tokens=3000)[0] == "maxi"
    name, why = auto_first(windows.values(), tokens=9000)  # fits none: the largest window
    assert name == "maxi" and "does not fit" in why


def test_auto_prefers_a_shorter_queue_among_those_the_prompt_fits(windows):
    windows["mini"].queued_now = 16
    name, why = auto_first(windows.values(), tokens=100)
    assert name == "midi" and "queue 0 of 64" in why
    assert auto_first(windows.values(), tokens=3000)[0] == "maxi"  # the queue never beats the window


def test_auto_weighs_windows_as_the_tier_caps_them(windows):
    # A plan that caps every window at 2048: a 3000-token prompt fits none of them.
    name, why = auto_first(windows.values(), tokens=3000, max_context=2048)
    assert "does not fit its 2048-token window" in why
    assert auto_first(windows.values(), tokens=100, sticky=windows["midi"], max_context=512)[0] == "midi"


@pytest.mark.topology
def test_auto_routes_each_message_of_a_conversation_and_records_why(alice, put_on_tier, windows):
    put_on_tier(alice, "enterprise")  # every model, no cap on the window
    sent = message_send(user=alice, request=SendRequest(content="Hello", model=AUTO))
    assert sent.generation.deployment.name == "mini"
    assert sent.generation.routing_reason.startswith("auto: a ")
    assert sent.conversation.model == AUTO
    run_to_end(sent.generation)
    long = "word " * 1200  # about 1200 tokens: too long for mini's window now
    again = message_send(user=alice, request=SendRequest(content=long, conversation_id=sent.conversation.id))
    assert again.generation.deployment.name == "midi"
    assert Conversation.objects.get(id=sent.conversation.id).model == AUTO


@pytest.mark.topology
def test_auto_through_the_hook_inference_routes_by(alice, put_on_tier, windows):
    put_on_tier(alice, "enterprise")
    routed = deployment_route(user=alice, model=AUTO, prompt_tokens=lambda d: 1500)
    assert routed.deployment.name == "midi" and routed.reason.startswith("auto:")


# --- cost ----------------------------------------------------------------------------------------


@pytest.mark.topology
def test_a_sticky_message_costs_no_statement_beyond_its_conversations_read(alice, default_deployment, canary):
    # Routing a conversation that stays where it is reads nothing: its deployment and queue came with
    # the conversation's locked read (tests/conversations/test_services.py counts that one).
    sent = message_send(user=alice, request=SendRequest(content="Hello"))
    run_to_end(sent.generation)
    deployment = Conversation.objects.get(id=sent.conversation.id).deployment
    deployment.queued_now = 0
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as routing:
        routed = route(user=alice, model=DEFAULT_DEPLOYMENT_NAME, sticky=deployment)
    assert routed.deployment == deployment and routing.captured_queries == []


@pytest.fixture
def redis_engine_state():
    """Report an engine's state as the process that hosts it would: its local host's state in the
    embedded default, a worker's heartbeat (seen `at`, now by default) in the production topology.
    (An engine that truly fails to load takes a minute of this machine; the state is what routing
    reads.) Both are taken back after the test."""
    touched, written = [], []

    def report(deployment: ModelDeployment, state: EngineState, *, at: float | None = None) -> None:
        if settings.INFERENCE_BACKEND == "local":
            spec = engine_spec_for(deployment)
            host = engine_host_for(spec)
            host.state = state
            touched.append(spec.host_name)
            return
        from inference.execution.workers import ENGINE_STATE_KEY, _redis

        # As a worker names its host: marked where the row puts it on the scripted engine.
        key = ENGINE_STATE_KEY.format(deployment=deployment.answer_model, state=state.value)
        _redis().zadd(key, {"routing-test": time.time() if at is None else at})
        written.append(key)

    yield report
    from inference.engine import host as hosts

    for name in touched:
        hosts._hosts.pop(name, None)
    if written:
        from inference.execution.workers import _redis

        for key in written:
            _redis().zrem(key, "routing-test")
