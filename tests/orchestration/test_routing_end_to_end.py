"""Routing and the prefix cache end to end, with the real engine: through the chat socket and through
the official `openai` client. Two deployments of the default model serve the public name `chat`; the
canary, which routing prefers, has a full queue, so its requests fall back to the default deployment
(the one whose engine runs in this test session)."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import openai
import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.test import Client

from accounts.models import Tier
from accounts.services import api_key_create, user_set_tier
from billing.models import TierModelPrice, UsageRecord
from inference.defaults import DEFAULT_DEPLOYMENT_NAME
from inference.models import Generation, ModelDeployment
from tests.helpers.engines import SCRIPTED_DEFAULT
from tests.helpers.sockets import drain_until_finished, open_socket
from tests.orchestration.test_routing import CANARY, fill_queue, full_canary_before

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def chat_name(default_deployment, bob, draws_the_heaviest) -> ModelDeployment:
    return full_canary_before(default_deployment, bob)


@pytest.fixture
def key_for(db):
    def make(user) -> str:
        return api_key_create(user=user, name="tests", scopes=["chat", "models:read"]).key

    return make


def client_for(server: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=120)


async def test_a_chat_message_falls_back_and_the_page_says_which_model_wrote_it(engine, alice, chat_name):
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "Say hello in five words.", "model": "chat"})
    events = await drain_until_finished(socket)
    accepted = next(e for e in events if e["type"] == "message.accepted")
    # The scripted engine answers here, and the name says so (ModelDeployment.answer_model).
    assert accepted["model"] == SCRIPTED_DEFAULT
    assert events[-1]["type"] == "generation.done", events[-1]
    assert "cached_tokens" in events[-1]["usage"]["prompt_tokens_details"]
    generation = await Generation.objects.select_related("deployment").aget(id=accepted["generation"])
    assert generation.deployment.name == DEFAULT_DEPLOYMENT_NAME
    assert "fallback" in generation.routing_reason and CANARY in generation.routing_reason
    await socket.disconnect()

    client = Client()
    await database_sync_to_async(client.force_login)(alice)
    page = await database_sync_to_async(client.get)(f"/c/{accepted['conversation']}/")
    assert f"Answered by {SCRIPTED_DEFAULT}" in page.content.decode()
    assert '<option value="chat" selected>' in page.content.decode()


async def test_the_openai_client_asks_for_a_public_name_and_is_told_which_model_wrote_it(
    chat_server, alice, key_for, chat_name
):
    client = client_for(chat_server, await database_sync_to_async(key_for)(alice))
    listed = {m.id for m in (await client.models.list()).data}
    assert {"auto", "chat"} <= listed and not {CANARY, DEFAULT_DEPLOYMENT_NAME} & listed
    completion = await client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert completion.model == SCRIPTED_DEFAULT
    assert completion.choices[0].message.content


async def test_the_api_answers_503_with_retry_after_when_no_deployment_can_take_it(
    server_without_engine, alice, bob, key_for, chat_name, default_deployment
):
    await ModelDeployment.objects.filter(id=default_deployment.id).aupdate(max_queued=1)
    await database_sync_to_async(fill_queue)(await ModelDeployment.objects.aget(id=default_deployment.id), bob)
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    assert refused.value.status_code == 503
    assert refused.value.code == "at_capacity"
    assert refused.value.response.headers["retry-after"] == str(settings.INFERENCE_AT_CAPACITY_RETRY_S)
    assert not await Generation.objects.filter(user=alice).aexists()


LONG_PROMPT = "Remember these facts and answer the question at the end.\n" + "\n".join(
    f"Fact {i}: box number {i} holds {i * 7 % 13} red marbles and {i * 5 % 11} blue ones." for i in range(40)
)


@pytest.mark.engine
async def test_a_long_prompt_sent_again_is_served_from_the_prefix_cache_and_charged_at_the_cached_rate(
    chat_server, alice, key_for
):
    await database_sync_to_async(user_set_tier)(user=alice, tier=await Tier.objects.aget(name="pro"))
    client = client_for(chat_server, await database_sync_to_async(key_for)(alice))
    messages = [{"role": "user", "content": LONG_PROMPT + "\nHow many red marbles are in box 3?"}]

    async def streamed_usage():
        stream = await client.chat.completions.create(
            model=DEFAULT_DEPLOYMENT_NAME,
            messages=messages,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        return [chunk async for chunk in stream][-1].usage

    first = await streamed_usage()
    assert first.prompt_tokens > 500
    second = await streamed_usage()
    assert 0 < second.prompt_tokens_details.cached_tokens <= second.prompt_tokens
    third = await client.chat.completions.create(model=DEFAULT_DEPLOYMENT_NAME, messages=messages, max_tokens=4)
    assert third.usage.prompt_tokens_details.cached_tokens > 0

    records = [r async for r in UsageRecord.objects.filter(user=alice).order_by("created_at")]
    assert [r.cached_tokens for r in records[1:]] == [
        second.prompt_tokens_details.cached_tokens,
        third.usage.prompt_tokens_details.cached_tokens,
    ]
    price = await TierModelPrice.objects.aget(tier__name="pro", deployment__name=DEFAULT_DEPLOYMENT_NAME)
    assert price.cached_prompt_price_per_1k < price.prompt_price_per_1k
    record = records[1]
    expected = (
        Decimal(record.prompt_tokens - record.cached_tokens) * price.prompt_price_per_1k / 1000
        + Decimal(record.cached_tokens) * price.cached_prompt_price_per_1k / 1000
        + Decimal(record.completion_tokens) * price.completion_price_per_1k / 1000
    ).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)
    assert record.cost == expected
    assert record.cached_price_per_1k == price.cached_prompt_price_per_1k
    # The usage page shows them.
    page_client = Client()
    await database_sync_to_async(page_client.force_login)(alice)
    page = await database_sync_to_async(page_client.get)("/accounts/usage/")
    assert f'id="cached-tokens">{sum(r.cached_tokens for r in records)}<' in page.content.decode()
