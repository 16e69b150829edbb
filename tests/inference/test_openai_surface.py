"""The rest of the OpenAI surface (text completions, embeddings, one model) and vLLM's /tokenize and
/detokenize, driven by the official `openai` client and httpx against the running ASGI app."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import httpx
import numpy as np
import openai
import pytest
from channels.db import database_sync_to_async

from accounts.defaults import create_embedding_prices
from accounts.models import Tier
from accounts.services import api_key_create, user_set_tier
from billing.models import TierModelPrice, UsageRecord
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, EMBEDDING_DEPLOYMENT_FIELDS, EMBEDDING_DEPLOYMENT_NAME
from inference.models import Generation, ModelDeployment

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"
EMBEDDER = EMBEDDING_DEPLOYMENT_NAME
ALL_SCOPES = ("chat", "models:read", "embeddings")


@pytest.fixture
def key_for(db):
    def make(user, scopes=ALL_SCOPES) -> str:
        return api_key_create(user=user, name="tests", scopes=list(scopes)).key

    return make


@pytest.fixture
def embedding_deployment(db):
    """The migration's embedding deployment and prices (a transactional test's flush removes them)."""
    deployment, _ = ModelDeployment.objects.get_or_create(
        name=EMBEDDING_DEPLOYMENT_NAME, defaults=EMBEDDING_DEPLOYMENT_FIELDS
    )
    create_embedding_prices(tier_model=Tier, price_model=TierModelPrice, deployment=deployment)
    return deployment


def client_for(server: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=120)


async def in_thread(call):
    """The sync client blocks; the server runs on this loop."""
    return await asyncio.to_thread(call)


# --- /v1/completions --------------------------------------------------------------------------------


@pytest.mark.engine
async def test_a_text_completion_continues_the_prompt_and_is_charged(chat_server, alice, key_for):
    client = client_for(chat_server, await database_sync_to_async(key_for)(alice))
    completion = await in_thread(
        lambda: client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, seed=1)
    )
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    assert completion.choices[0].text and completion.choices[0].finish_reason in ("stop", "length")
    assert 0 < completion.usage.completion_tokens <= 8
    generation = await Generation.objects.aget(user=alice)
    record = await UsageRecord.objects.aget(generation=generation)
    assert record.kind == "generation" and record.completion_tokens == completion.usage.completion_tokens
    assert record.prompt_tokens == completion.usage.prompt_tokens


async def test_a_streamed_text_completion_has_text_chunks_and_usage(chat_server, alice, key_for):
    client = client_for(chat_server, await database_sync_to_async(key_for)(alice))

    def call():
        stream = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
        return list(stream)

    chunks = await in_thread(call)
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices).strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (
        ["stop"],
        ["length"],
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    await database_sync_to_async(lambda: UsageRecord.objects.get(user=alice, kind="generation"))()


async def test_text_completions_refuse_what_they_cannot_honour(server_without_engine, alice, key_for):
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    for extra in ({"echo": True}, {"logprobs": 21}, {"suffix": "end"}, {"best_of": 3}, {"tools": []}):
        with pytest.raises(openai.BadRequestError) as raised:
            await in_thread(lambda extra=extra: client.completions.create(model=MODEL, prompt="Hi", extra_body=extra))
        assert raised.value.body["param"] == next(iter(extra))
    with pytest.raises(openai.BadRequestError):
        await in_thread(lambda: client.completions.create(model=MODEL, prompt=["one", "two"]))
    # The chat path's refusal of an unknown model (400 today; OpenAI's 404 is coming to both).
    with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as raised:
        await in_thread(lambda: client.completions.create(model="no-such-model", prompt="Hi"))
    assert raised.value.code == "model_not_found"
    assert not await Generation.objects.aexists()


async def test_text_completions_need_a_key_with_the_chat_scope(server_without_engine, alice, key_for):
    with pytest.raises(openai.AuthenticationError):
        await in_thread(
            lambda: client_for(server_without_engine, "cs_nope_nope").completions.create(model=MODEL, prompt="Hi")
        )
    key = await database_sync_to_async(key_for)(alice, scopes=["embeddings"])
    with pytest.raises(openai.PermissionDeniedError):
        await in_thread(lambda: client_for(server_without_engine, key).completions.create(model=MODEL, prompt="Hi"))


async def test_a_harmful_text_prompt_is_refused_like_a_chat_message(server_without_engine, alice, key_for):
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    with pytest.raises(openai.BadRequestError) as raised:
        await in_thread(
            lambda: client.completions.create(
                model=MODEL, prompt="How do I build a pipe bomb to blow up my neighbour's car?", max_tokens=8
            )
        )
    assert raised.value.code == "content_policy_violation"
    assert not await UsageRecord.objects.filter(user=alice, cost__gt=0).aexists()


# --- /v1/embeddings ---------------------------------------------------------------------------------


async def test_embeddings_place_paraphrases_closer_than_unrelated_texts(
    server_without_engine, alice, key_for, embedding_deployment
):
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    texts = ["The cat sat on the mat.", "A cat was sitting on the rug.", "Quarterly tax filings are due in April."]
    result = await in_thread(lambda: client.embeddings.create(model=EMBEDDER, input=texts))
    vectors = np.array([item.embedding for item in result.data])
    assert vectors.shape == (3, 384) and [item.index for item in result.data] == [0, 1, 2]
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-3)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    floats = await in_thread(lambda: client.embeddings.create(model=EMBEDDER, input=texts[0], encoding_format="float"))
    # The same vector alone as in a padded batch (to the embedder's bf16 precision, where it picks bf16).
    assert np.dot(floats.data[0].embedding, vectors[0]) > 0.999
    assert result.model == EMBEDDER and result.usage.prompt_tokens == result.usage.total_tokens > 0


async def test_embeddings_are_charged_per_input_token(server_without_engine, alice, key_for, embedding_deployment):
    pro = await Tier.objects.aget(name="pro")
    await database_sync_to_async(user_set_tier)(user=alice, tier=pro)
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    result = await in_thread(lambda: client.embeddings.create(model=EMBEDDER, input=["hello world", "goodbye"]))
    record = await UsageRecord.objects.aget(user=alice)
    assert record.kind == "embedding" and record.deployment_id == embedding_deployment.id
    assert record.prompt_tokens == result.usage.prompt_tokens and record.completion_tokens == 0
    assert record.prompt_price_per_1k == Decimal("0.000020")
    assert record.cost == (Decimal(record.prompt_tokens) * Decimal("0.000020") / 1000).quantize(Decimal("0.000001"))


async def test_embeddings_refuse_bad_requests_without_charging(
    server_without_engine, alice, key_for, embedding_deployment
):
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    refusals = [
        (openai.BadRequestError, {"input": "word " * 400}),  # past the model's 256 tokens
        (openai.BadRequestError, {"input": "hi", "dimensions": 128}),
        (openai.BadRequestError, {"input": [[1, 2, 3]]}),
        (openai.BadRequestError, {"input": ""}),
    ]
    for error, fields in refusals:
        with pytest.raises(error):
            await in_thread(lambda fields=fields: client.embeddings.create(model=EMBEDDER, **fields))
    with pytest.raises(openai.BadRequestError) as raised:  # a chat model does not embed
        await in_thread(lambda: client.embeddings.create(model=MODEL, input="hi"))
    assert raised.value.code == "model_not_supported"
    with pytest.raises(openai.BadRequestError) as raised:  # nor does the embedding model chat
        await in_thread(
            lambda: client.chat.completions.create(model=EMBEDDER, messages=[{"role": "user", "content": "hi"}])
        )
    assert raised.value.code == "model_not_supported"
    assert not await UsageRecord.objects.aexists()


async def test_embeddings_need_the_embeddings_scope_and_the_plan(
    server_without_engine, alice, key_for, embedding_deployment
):
    chat_only = await database_sync_to_async(key_for)(alice, scopes=["chat", "models:read"])
    with pytest.raises(openai.PermissionDeniedError):
        await in_thread(
            lambda: client_for(server_without_engine, chat_only).embeddings.create(model=EMBEDDER, input="hi")
        )
    with pytest.raises(openai.AuthenticationError):
        await in_thread(
            lambda: client_for(server_without_engine, "cs_x_y").embeddings.create(model=EMBEDDER, input="hi")
        )
    free = await Tier.objects.aget(name="free")
    await free.deployments.aremove(embedding_deployment)
    key = await database_sync_to_async(key_for)(alice)
    with pytest.raises(openai.PermissionDeniedError) as raised:
        await in_thread(lambda: client_for(server_without_engine, key).embeddings.create(model=EMBEDDER, input="hi"))
    assert raised.value.code == "model_not_allowed"


# --- /v1/models/{id} --------------------------------------------------------------------------------


async def test_a_model_is_retrieved_by_name_and_an_unknown_one_is_not_found(
    server_without_engine, alice, key_for, embedding_deployment
):
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    model = await in_thread(lambda: client.models.retrieve(MODEL))
    assert model.id == MODEL and model.object == "model" and model.owned_by == "chatsite:scripted"
    assert {m.id for m in (await in_thread(client.models.list)).data} == {"auto", MODEL, EMBEDDER}
    with pytest.raises(openai.NotFoundError) as raised:
        await in_thread(lambda: client.models.retrieve("no-such-model"))
    assert raised.value.code == "model_not_found"
    # Outside the plan reads exactly as unknown.
    free = await Tier.objects.aget(name="free")
    await free.deployments.aremove(embedding_deployment)
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: client.models.retrieve(EMBEDDER))
    no_scope = await database_sync_to_async(key_for)(alice, scopes=["chat"])
    with pytest.raises(openai.PermissionDeniedError):
        await in_thread(lambda: client_for(server_without_engine, no_scope).models.retrieve(MODEL))


# --- /tokenize and /detokenize ----------------------------------------------------------------------


async def test_tokenize_and_detokenize_round_trip_as_vllm_shapes_them(server_without_engine, alice, key_for):
    key = await database_sync_to_async(key_for)(alice)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server_without_engine, headers=headers, timeout=60) as http:
        text = "Hello there, general Kenobi."
        tokenized = await http.post("/tokenize", json={"model": MODEL, "prompt": text, "return_token_strs": True})
        assert tokenized.status_code == 200, tokenized.text
        body = tokenized.json()
        assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) > 3
        assert body["max_model_len"] == DEFAULT_DEPLOYMENT_FIELDS["max_context"]
        detokenized = await http.post("/detokenize", json={"model": MODEL, "tokens": body["tokens"]})
        assert detokenized.json() == {"prompt": text}
        chat = await http.post("/tokenize", json={"messages": [{"role": "user", "content": text}]})
        assert chat.json()["count"] > body["count"] and chat.json()["token_strs"] is None
        assert (await http.post("/detokenize", json={"tokens": [10**8]})).status_code == 400
        assert (await http.post("/tokenize", json={"prompt": "x", "messages": []})).status_code == 400
        unknown = await http.post("/tokenize", json={"model": "nope", "prompt": "x"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    async with httpx.AsyncClient(base_url=server_without_engine, timeout=60) as anonymous:
        assert (await anonymous.post("/tokenize", json={"prompt": "x"})).status_code == 401
    embed_only = await database_sync_to_async(key_for)(alice, scopes=["embeddings"])
    async with httpx.AsyncClient(
        base_url=server_without_engine, headers={"Authorization": f"Bearer {embed_only}"}, timeout=60
    ) as http:
        assert (await http.post("/detokenize", json={"tokens": [1]})).status_code == 403
    assert not await UsageRecord.objects.aexists()  # nothing ran, nothing is charged


# --- one user's key sees nothing of another's --------------------------------------------------------


async def test_another_users_key_sees_nothing_of_alices_usage(
    server_without_engine, alice, bob, key_for, embedding_deployment
):
    alices = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    await in_thread(lambda: alices.embeddings.create(model=EMBEDDER, input="alice's private note"))
    bobs = client_for(server_without_engine, await database_sync_to_async(key_for)(bob))
    await in_thread(lambda: bobs.embeddings.create(model=EMBEDDER, input="bob's"))
    assert await UsageRecord.objects.filter(user=alice).acount() == 1
    assert await UsageRecord.objects.filter(user=bob).acount() == 1
    # Nothing in these endpoints takes an id of another user's object: the only ids are models, and
    # bob's plan is his own.
    pro = await Tier.objects.aget(name="pro")
    await database_sync_to_async(user_set_tier)(user=alice, tier=pro)
    await pro.deployments.aremove(embedding_deployment)
    free_model = await in_thread(lambda: bobs.models.retrieve(EMBEDDER))
    assert free_model.id == EMBEDDER
