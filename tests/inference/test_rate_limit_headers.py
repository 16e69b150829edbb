"""The `x-ratelimit-*` headers OpenAI's clients read, from the buckets that admit the request, on
answers and refusals alike, read through the official client's raw responses."""

from __future__ import annotations

import asyncio

import openai
import pytest
from channels.db import database_sync_to_async
from rest_framework.test import APIClient

from accounts.defaults import create_embedding_prices
from accounts.models import Tier
from accounts.ratelimit import bucket_consume
from accounts.services import api_key_create, user_set_tier
from billing.models import TierModelPrice
from inference.defaults import EMBEDDING_DEPLOYMENT_FIELDS, EMBEDDING_DEPLOYMENT_NAME
from inference.models import Generation, ModelDeployment
from inference.openai.ratelimits import duration

MODEL = "smollm2-135m"
NAMES = [f"x-ratelimit-{what}-{kind}" for kind in ("requests", "tokens") for what in ("limit", "remaining", "reset")]


def key_of(user, **caps) -> str:
    created = api_key_create(user=user, name="tests", scopes=["chat", "models:read", "embeddings"], **caps)
    return created.key


def client_for(server: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=60)


def seconds(text: str) -> float:
    """A reset duration back in seconds ("6m0s", "1.5s", "20ms")."""
    if text.endswith("ms"):
        return int(text[:-2]) / 1000
    total, number = 0.0, ""
    for char in text:
        if char in "hms":
            total += float(number) * {"h": 3600, "m": 60, "s": 1}[char]
            number = ""
        else:
            number += char
    return total


@pytest.mark.django_db(transaction=True)
async def test_an_embedding_answer_says_what_the_minute_has_left(server_without_engine, alice):
    deployment, _ = await ModelDeployment.objects.aget_or_create(
        name=EMBEDDING_DEPLOYMENT_NAME, defaults=EMBEDDING_DEPLOYMENT_FIELDS
    )
    await database_sync_to_async(create_embedding_prices)(
        tier_model=Tier, price_model=TierModelPrice, deployment=deployment
    )
    client = client_for(server_without_engine, await database_sync_to_async(key_of)(alice))
    raw = await asyncio.to_thread(
        lambda: client.embeddings.with_raw_response.create(
            model=EMBEDDING_DEPLOYMENT_NAME, input=["hello world " * 20] * 20
        )
    )
    tokens = raw.parse().usage.prompt_tokens
    headers = raw.headers
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == ("10", "9")
    assert headers["x-ratelimit-limit-tokens"] == "8000"
    # The bucket refills 8000/60 tokens a second: what is left is what was, plus what refilled since.
    assert 8000 - tokens <= int(headers["x-ratelimit-remaining-tokens"]) < 8000 - tokens / 2
    assert 5 <= seconds(headers["x-ratelimit-reset-requests"]) <= 6  # one request refills in 60/10 s
    assert 0 < seconds(headers["x-ratelimit-reset-tokens"]) <= 60 * tokens / 8000


@pytest.mark.django_db(transaction=True)
async def test_a_refused_chat_completion_says_nothing_is_left_and_when_it_is_full(server_without_engine, alice):
    await Tier.objects.filter(name="free").aupdate(requests_per_minute=2)
    for _ in range(2):
        await database_sync_to_async(bucket_consume)(key=f"user:{alice.id}:requests", capacity=2, period_s=60)
    client = client_for(server_without_engine, await database_sync_to_async(key_of)(alice))
    with pytest.raises(openai.RateLimitError) as refused:
        await asyncio.to_thread(
            lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        )
    headers = refused.value.response.headers
    assert set(NAMES) <= set(headers)
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == ("2", "0")
    assert 55 <= seconds(headers["x-ratelimit-reset-requests"]) <= 60
    assert headers["x-ratelimit-remaining-tokens"] == "8000"  # a refused request takes nothing
    assert 1 <= int(headers["retry-after"]) <= 30
    assert not await Generation.objects.aexists()


@pytest.mark.django_db(transaction=True)
async def test_an_admitted_chat_completion_counts_its_prompt_and_budget(server_without_engine, alice, nothing_runs):
    client = client_for(server_without_engine, await database_sync_to_async(key_of)(alice))

    def call():
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=400, stream=True
        ) as raw:
            return raw.headers  # read before the answer, which nothing runs

    headers = await asyncio.to_thread(call)
    generation = await Generation.objects.aget()
    charged = len(generation.prompt_token_ids) + 400
    assert headers["x-ratelimit-remaining-requests"] == "9"
    assert 8000 - charged <= int(headers["x-ratelimit-remaining-tokens"]) < 8000 - charged / 2


@pytest.mark.django_db
def test_a_keys_own_lower_cap_is_the_one_reported(alice):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key_of(alice, requests_per_minute=3)}")
    response = client.post("/tokenize", {"model": MODEL, "prompt": "hello"}, format="json")
    assert response.status_code == 200, response.content
    assert (response["x-ratelimit-limit-requests"], response["x-ratelimit-remaining-requests"]) == ("3", "2")
    assert response["x-ratelimit-limit-tokens"] == "8000"


@pytest.mark.django_db
def test_a_plan_without_limits_sends_none(alice):
    user_set_tier(user=alice, tier=Tier.objects.get(name="admin"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key_of(alice)}")
    response = client.post("/tokenize", {"model": MODEL, "prompt": "hello"}, format="json")
    assert response.status_code == 200
    assert not [name for name in NAMES if name in response]


def test_durations_are_written_as_openai_writes_them():
    assert [duration(s) for s in (0.02, 1, 1.5, 6.0, 60, 360, 3723)] == [
        "20ms",
        "1s",
        "1.5s",
        "6s",
        "1m0s",
        "6m0s",
        "1h2m3s",
    ]
