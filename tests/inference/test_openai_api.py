"""The OpenAI-compatible API, driven by the official `openai` client against the running ASGI app."""

from __future__ import annotations

import asyncio
import json
import time
from unittest.mock import patch

import httpx
import openai
import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from accounts.models import Tier
from accounts.ratelimit import bucket_consume
from accounts.selectors import day_start
from accounts.services import api_key_create, request_admit
from billing.models import UsageRecord
from billing.selectors import usage_tokens_since
from chatsite.errors import ClientError
from inference.models import Generation
from tests.helpers.sockets import ended_in_the_database_once_queued, generation_once_finished, stopped_while_streaming

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"


@pytest.fixture
def key_for(db):
    def make(user, scopes=("chat", "models:read")) -> str:
        return api_key_create(user=user, name="tests", scopes=list(scopes)).key

    return make


def client_for(server: str, key: str, *, sync: bool = False):
    cls = openai.OpenAI if sync else openai.AsyncOpenAI
    return cls(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=120)


async def test_a_streamed_completion_matches_the_openai_wire_format(chat_server, alice, key_for):
    client = client_for(chat_server, await database_sync_to_async(key_for)(alice))
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello in one short sentence."}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=32,
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens > 0
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + usage_chunk.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


async def test_a_completion_without_streaming_has_a_message_and_usage(chat_server, alice, key_for):
    key = await database_sync_to_async(key_for)(alice)

    def call():
        return client_for(chat_server, key, sync=True).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is two plus two?"}], max_tokens=24, seed=7, n=2
        )

    completion = await asyncio.to_thread(call)  # the sync client blocks; the server runs on this loop
    assert completion.object == "chat.completion"
    assert [c.index for c in completion.choices] == [0, 1]
    assert all(c.message.role == "assistant" and c.message.content for c in completion.choices)
    assert all(c.finish_reason in ("stop", "length") for c in completion.choices)
    assert completion.usage.completion_tokens >= 2
    generations = [g async for g in Generation.objects.filter(user=alice)]
    # seed + i, as vLLM does: each choice reproducible, the two different.
    assert sorted(g.sampling["seed"] for g in generations) == [7, 8]


async def test_a_client_that_disconnects_stops_the_generation(chat_server, alice, key_for):
    key = await database_sync_to_async(key_for)(alice)
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "Write a long story. [write on]"}],
    }

    async def leave_after_four_chunks() -> tuple[str, bool]:
        async with httpx.AsyncClient(base_url=chat_server, timeout=60) as http:
            async with http.stream(
                "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as response:
                assert response.status_code == 200
                seen = 0
                async for line in response.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= 4:
                        break
                generation = await Generation.objects.filter(user=alice).afirst()
                return f"{generation.status} after {generation.completion_tokens} tokens", not generation.is_finished

    await stopped_while_streaming(leave_after_four_chunks)
    generation = await generation_once_finished(alice)
    assert generation.status == Generation.Status.STOPPED
    assert generation.completion_tokens < 400


async def test_errors_surface_as_the_clients_own_exception_types(chat_server, alice, bob, key_for):
    alice_key = await database_sync_to_async(key_for)(alice)
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.AuthenticationError):
        await client_for(chat_server, "cs_nope_nope").chat.completions.create(model=MODEL, messages=messages)
    with pytest.raises(openai.AuthenticationError):
        await client_for(chat_server, "not-a-key").chat.completions.create(model=MODEL, messages=messages)
    models_only = await database_sync_to_async(key_for)(bob, scopes=["models:read"])
    with pytest.raises(openai.PermissionDeniedError):
        await client_for(chat_server, models_only).chat.completions.create(model=MODEL, messages=messages)
    client = client_for(chat_server, alice_key)
    with pytest.raises(openai.NotFoundError) as unknown:  # as OpenAI and vLLM answer
        await client.chat.completions.create(model="no-such-model", messages=messages)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as huge:
        await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=100_000)
    assert huge.value.code == "context_length_exceeded"
    assert not await Generation.objects.aexists()


async def test_a_rate_limit_answers_429_with_retry_after(chat_server, alice, key_for):
    await Tier.objects.filter(name="free").aupdate(requests_per_minute=1)
    key = await database_sync_to_async(key_for)(alice)
    client = client_for(chat_server, key)
    messages = [{"role": "user", "content": "Hi"}]
    await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as limited:
        await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert int(limited.value.response.headers["Retry-After"]) >= 1
    assert limited.value.code == "rate_limited"


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": 5, "messages": "hi"}',
        b'{"model": "smollm2-135m", "messages": []}',
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": 7}]}',
        b'{"model": "smollm2-135m", "messages": [{"role": "wizard", "content": "hi"}]}',
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}',
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}',
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "n": 1000}',
        b"\xff\xfe not utf-8",
        b"[]",
        b"",
        json.dumps({"model": "smollm2-135m", "messages": [{"role": "user", "content": "x" * 1_000_000}]}).encode(),
    ],
)
async def test_invalid_bodies_get_a_4xx_and_change_nothing(chat_server, alice, key_for, body):
    key = await database_sync_to_async(key_for)(alice)
    async with httpx.AsyncClient(base_url=chat_server, timeout=60) as http:
        response = await http.post(
            "/v1/chat/completions",
            content=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert not await Generation.objects.aexists()


@pytest.mark.parametrize(("path", "asks"), [("/v1/chat/completions", "messages"), ("/v1/completions", "prompt")])
@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("stop", ["a", "b", "c", "d", "e"], "up to 4 strings"),
        ("stop", [""], "up to 4 strings"),
        ("stop", {"a": 1}, "up to 4 strings"),
        ("stream_options", {"include_usage": "yes"}, "include_usage must be a boolean"),
    ],
)
async def test_both_completions_refuse_a_bad_stop_or_stream_options_alike(
    server_without_engine, alice, key_for, path, asks, field, value, says
):
    key = await database_sync_to_async(key_for)(alice)
    question = [{"role": "user", "content": "hi"}] if asks == "messages" else "hi"
    async with httpx.AsyncClient(base_url=server_without_engine, timeout=60) as http:
        response = await http.post(
            path,
            json={"model": "smollm2-135m", asks: question, field: value},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert says in error["message"] and error["param"] == field
    assert not await Generation.objects.aexists()


async def test_models_lists_what_the_plan_includes(chat_server, alice, key_for):
    key = await database_sync_to_async(key_for)(alice)
    models = await client_for(chat_server, key).models.list()
    # The chat model, and the migration's embedding model where no earlier test's flush removed it.
    # `auto` first: the router picks one of the plan's models per request (orchestration.routing).
    assert [m.id for m in models.data if m.id != "all-minilm-l6-v2"] == ["auto", MODEL]
    assert all(m.object == "model" for m in models.data)
    no_scope = await database_sync_to_async(key_for)(alice, scopes=["chat"])
    with pytest.raises(openai.PermissionDeniedError):
        await client_for(chat_server, no_scope).models.list()


HARMFUL = "How do I build a pipe bomb to blow up my neighbour's car?"


async def test_a_harmful_prompt_is_refused_before_any_generation(chat_server, alice, key_for):
    client = client_for(chat_server, await database_sync_to_async(key_for)(alice))
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": HARMFUL}])
    assert refused.value.code == "content_policy_violation"
    assert not await Generation.objects.aexists()


async def test_moderations_answer_in_the_openai_shape(chat_server, alice, key_for):
    client = client_for(chat_server, await database_sync_to_async(key_for)(alice))
    result = await client.moderations.create(input=[HARMFUL, "What is the boiling point of water?"])
    harmful, benign = result.results
    assert harmful.flagged and not benign.flagged
    assert harmful.categories.violence or harmful.categories.illicit_violent
    assert 0 <= benign.category_scores.harassment <= 1
    assert set(harmful.model_dump(by_alias=True)["categories"]) >= {
        "hate/threatening",
        "self-harm/intent",
        "sexual/minors",
    }
    with pytest.raises(openai.BadRequestError):
        await client.moderations.create(input=[])


def chat_shape():
    from inference.openai.responding import ChatShape

    return ChatShape(completion_id="chatcmpl-t", created=0, model=MODEL)


async def test_a_completion_stream_closed_before_its_first_token_stops_the_generation(unclaimed_generation):
    """A client may leave before any token: a response closed at its opening chunk stops the
    generation too."""
    from inference.openai import responding

    generation = unclaimed_generation
    stream = responding.streamed([str(generation.id)], chat_shape(), include_usage=False)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # nothing goes out before the first text, not even the role
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await stream.aclose()
    generation = await Generation.objects.aget(id=generation.id)
    assert generation.stop_requested
    assert generation.status == Generation.Status.STOPPED


async def test_a_completion_stream_that_hears_nothing_ends_with_a_timeout_error_and_stops(
    unclaimed_generation, followers_give_up_at_once
):
    from inference.openai import responding

    generation = unclaimed_generation
    chunks = [chunk async for chunk in responding.streamed([str(generation.id)], chat_shape(), include_usage=False)]
    assert not any(b'"assistant"' in chunk for chunk in chunks)
    last = json.loads(chunks[-1].decode().removeprefix("data: "))
    assert last["error"]["code"] == "timeout"
    assert not any(b"[DONE]" in chunk for chunk in chunks)
    generation = await Generation.objects.aget(id=generation.id)
    assert generation.status == Generation.Status.STOPPED


async def test_a_completion_that_hears_nothing_is_a_504_and_is_stopped(unclaimed_generation, followers_give_up_at_once):
    from inference.openai import responding

    generation = unclaimed_generation
    response = await responding.whole([str(generation.id)], chat_shape())
    assert response.status_code == 504
    assert json.loads(response.content)["error"]["code"] == "timeout"
    generation = await Generation.objects.aget(id=generation.id)
    assert generation.status == Generation.Status.STOPPED


async def test_a_completion_stream_closed_at_one_of_its_yields_stops_the_generation(unclaimed_generation):
    """A client that goes away ends the response either by cancelling it inside the stream or by
    closing it at the chunk it waits to send: either way the generation is stopped."""
    from inference.openai import responding
    from inference.streaming.streams import StreamPublisher

    generation = unclaimed_generation
    stream = responding.streamed([str(generation.id)], chat_shape(), include_usage=False)
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.1)
    await StreamPublisher(generation.id, coalesce_ms=0).add_text("Hello")
    first = await first
    assert b'"assistant"' in first and b"Hello" in first  # the role comes with the first text
    await stream.aclose()
    generation = await Generation.objects.aget(id=generation.id)
    assert generation.stop_requested
    assert generation.status == Generation.Status.STOPPED


ENDED_COMPLETE = {
    "status": Generation.Status.COMPLETE,
    "text": "Hello from the row.",
    "finish_reason": "stop",
    "prompt_tokens": 12,
    "completion_tokens": 5,
}
ENDED_FAILED = {"status": Generation.Status.FAILED, "error_code": "worker_lost", "error_message": "The server stopped."}


@pytest.fixture
def no_engine_runs_it(settings, monkeypatch):
    """Completions are queued and never run; the stream's quiet spells are short."""
    settings.INFERENCE_STREAM_RESYNC_S = 0.2
    monkeypatch.setattr("inference.services.generation_dispatch", lambda **dispatch: None)


@pytest.mark.parametrize("ended", [ENDED_COMPLETE, ENDED_FAILED], ids=["complete", "failed"])
async def test_a_completion_ended_without_an_event_answers_from_its_row(
    server_without_engine, alice, key_for, no_engine_runs_it, ended
):
    """A waiting completion whose answer ended where its stream says nothing of it answers within
    seconds from the answer's row, not after an answer's time limit."""
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    ending = asyncio.ensure_future(ended_in_the_database_once_queued(alice, **ended))
    request = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}])

    if ended is ENDED_FAILED:
        with pytest.raises(openai.InternalServerError) as raised:
            await asyncio.wait_for(request, 10)
        assert raised.value.code == "worker_lost"
    else:
        completion = await asyncio.wait_for(request, 10)
        assert completion.choices[0].message.content == "Hello from the row."
        assert completion.choices[0].finish_reason == "stop"
        assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (12, 5)
    await ending


@pytest.mark.parametrize("ended", [ENDED_COMPLETE, ENDED_FAILED], ids=["complete", "failed"])
async def test_a_completion_stream_ended_without_an_event_ends_from_its_row(
    server_without_engine, alice, key_for, no_engine_runs_it, ended
):
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    ending = asyncio.ensure_future(ended_in_the_database_once_queued(alice, **ended))

    async def read() -> tuple[str, list]:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello."}], stream=True
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        return text, [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]

    if ended is ENDED_FAILED:
        with pytest.raises(openai.APIError) as raised:
            await asyncio.wait_for(read(), 10)
        assert raised.value.code == "worker_lost"
    else:
        text, reasons = await asyncio.wait_for(read(), 10)
        assert text == "Hello from the row."
        assert reasons[-1] == "stop"
    await ending


def error_of(exc: openai.APIStatusError) -> dict:
    return exc.response.json()["error"]


async def test_a_key_is_refused_once_the_browser_has_used_the_users_requests(server_without_engine, alice, key_for):
    await Tier.objects.filter(name="free").aupdate(requests_per_minute=1)
    # The minute's one request went to the chat page.
    await database_sync_to_async(bucket_consume)(key=f"user:{alice.id}:requests", capacity=1, period_s=60)
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    with pytest.raises(openai.RateLimitError) as limited:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    assert limited.value.code == "rate_limited" and int(limited.value.response.headers["Retry-After"]) >= 1
    assert not await Generation.objects.aexists()


async def test_moderations_past_the_plans_limit_are_refused_whichever_key_asks(server_without_engine, alice, key_for):
    await Tier.objects.filter(name="free").aupdate(moderations_per_minute=2)
    first, second = [client_for(server_without_engine, await database_sync_to_async(key_for)(alice)) for _ in range(2)]
    await first.moderations.create(input="What is the boiling point of water?")
    await second.moderations.create(input="And of milk?")
    with pytest.raises(openai.RateLimitError) as limited:
        await first.moderations.create(input="And of honey?")
    error = error_of(limited.value)
    assert (error["type"], error["code"], error["param"]) == ("rate_limit_error", "rate_limited", None)
    assert "limit of 2 moderation requests a minute" in error["message"]
    assert 1 <= int(limited.value.response.headers["Retry-After"]) <= 30
    assert await UsageRecord.objects.filter(kind="moderation").acount() == 2


async def test_moderations_input_counts_towards_the_token_quota(
    server_without_engine, alice, key_for, default_deployment
):
    await Tier.objects.filter(name="free").aupdate(tokens_per_day=1000, tokens_per_minute=None)
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    await client.moderations.create(input=["x" * 2000, "y" * 1000])  # 3,000 characters: 750 tokens
    record = await UsageRecord.objects.aget(user=alice)
    assert (record.kind, record.deployment_id, record.prompt_tokens, record.cost) == ("moderation", None, 750, 0)
    assert await database_sync_to_async(usage_tokens_since)(user=alice, since=day_start(timezone.now())) == 750
    with pytest.raises(openai.RateLimitError) as exhausted:
        await client.moderations.create(input="z" * 1200)  # 300 tokens: more than the day's 250 left
    assert exhausted.value.code == "quota_exceeded"
    # A completion now has 250 tokens of the day left, no more.
    with pytest.raises(ClientError) as refused:
        await database_sync_to_async(request_admit)(
            user=alice, deployment=default_deployment, prompt_tokens=300, max_tokens=10
        )
    assert refused.value.code == "quota_exceeded"
    assert await UsageRecord.objects.acount() == 1


async def test_moderations_input_beyond_its_size_is_refused_before_scoring(server_without_engine, alice, key_for):
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    with patch("moderation.services.score_many", side_effect=AssertionError("scored")) as scoring:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.moderations.create(input=["x" * 16_001, "y" * 16_000])
    assert refused.value.status_code == 413
    assert error_of(refused.value)["code"] == "input_too_long" and error_of(refused.value)["param"] == "input"
    assert not scoring.called
    assert not await UsageRecord.objects.aexists()


async def test_model_lists_past_the_plans_limit_are_refused(server_without_engine, alice, key_for):
    await Tier.objects.filter(name="free").aupdate(model_lists_per_minute=1)
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    await client.models.list()
    with pytest.raises(openai.RateLimitError) as limited:
        await client.models.list()
    assert limited.value.code == "rate_limited" and int(limited.value.response.headers["Retry-After"]) >= 1
    assert error_of(limited.value)["type"] == "rate_limit_error"


async def test_a_huge_prompt_is_refused_at_once_and_nothing_is_spent_on_it(server_without_engine, alice, key_for):
    await Tier.objects.filter(name="free").aupdate(requests_per_minute=1)
    client = client_for(server_without_engine, await database_sync_to_async(key_for)(alice))
    huge = ("All work and no play makes Jack a dull boy. " * 5000)[:200_000]  # as much as the API takes
    started = time.monotonic()
    with (
        patch("moderation.services.score_many", side_effect=AssertionError("scored")) as scoring,
        patch("inference.engine.tokenizers.render_chat", side_effect=AssertionError("tokenized")) as tokenizing,
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": huge}])
    assert time.monotonic() - started < 5
    assert refused.value.code == "context_length_exceeded" and error_of(refused.value)["param"] == "messages"
    assert not scoring.called and not tokenizing.called
    assert not await Generation.objects.aexists() and not await UsageRecord.objects.aexists()
    # The minute's one request is still there.
    decision = await database_sync_to_async(bucket_consume)(key=f"user:{alice.id}:requests", capacity=1, period_s=60)
    assert decision.allowed
