"""Log probabilities on /v1/chat/completions and /v1/completions, in OpenAI's two shapes, from the
real engine (vLLM's `SamplingParams(logprobs=...)`), driven by the official `openai` client."""

from __future__ import annotations

import openai
import pytest

from inference.models import Generation
from inference.openai import wire

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"
HELLO = [{"role": "user", "content": "Name three colours."}]
# Greedy, and no repetition penalty (the deployment's default has one): the sampled token is then
# the most likely one the engine reports.
GREEDY = {"temperature": 0, "extra_body": {"repetition_penalty": 1.0}}


def assert_chat_entry(entry, *, top: int) -> None:
    assert entry.logprob <= 0
    assert entry.bytes == list(entry.token.encode("utf-8", errors="replace"))
    assert len(entry.top_logprobs) == top
    ranked = [alternative.logprob for alternative in entry.top_logprobs]
    assert ranked == sorted(ranked, reverse=True)
    assert all(alternative.bytes == list(alternative.token.encode()) for alternative in entry.top_logprobs)


@pytest.mark.engine
async def test_a_chat_completion_gives_each_tokens_logprob_and_its_likeliest_alternatives(
    chat_server, alice, client_of
):
    client = await client_of(chat_server, alice)
    completion = await client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=8, logprobs=True, top_logprobs=3, n=2, seed=1, **GREEDY
    )
    for choice in completion.choices:
        content = choice.logprobs.content
        assert len(content) == completion.usage.completion_tokens // 2 == 8
        assert "".join(entry.token for entry in content) == choice.message.content
        for entry in content:
            assert_chat_entry(entry, top=3)
            # Greedy: the sampled token is a likeliest one. In bfloat16 two tokens often tie exactly, and
            # which of them the ranking lists first differs between CPUs: the sampled one is among them.
            likeliest = entry.top_logprobs[0].logprob
            assert entry.logprob == pytest.approx(likeliest)
            assert entry.token in [a.token for a in entry.top_logprobs if a.logprob == pytest.approx(likeliest)]


@pytest.mark.engine
async def test_a_streamed_chat_completion_carries_logprobs_in_its_chunks(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    stream = await client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=10, logprobs=True, top_logprobs=2, stream=True, **GREEDY
    )
    text, entries = "", []
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                entries += choice.logprobs.content
    assert len(entries) == 10
    assert "".join(entry.token for entry in entries) == text
    for entry in entries:
        assert_chat_entry(entry, top=2)


@pytest.mark.engine
async def test_logprobs_without_alternatives_give_none_and_no_logprobs_give_null(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    plain = await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3, logprobs=False)
    assert plain.choices[0].logprobs is None
    sampled_only = await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3, logprobs=True)
    assert [entry.top_logprobs for entry in sampled_only.choices[0].logprobs.content] == [[], [], []]


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": True, "top_logprobs": 21},
        {"logprobs": True, "top_logprobs": -1},
        {"logprobs": False, "top_logprobs": 2},
        {"top_logprobs": 2},
    ],
)
async def test_top_logprobs_out_of_range_or_without_logprobs_is_refused_by_name(
    server_without_engine, alice, client_of, fields
):
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=HELLO, **fields)
    assert (refused.value.body["param"], refused.value.body["code"]) == ("top_logprobs", "invalid_value")
    assert not await Generation.objects.aexists()


# --- /v1/completions: the legacy shape ----------------------------------------------------------------


def assert_legacy(logprobs, *, top: int, offset: int = 0) -> None:
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs)
    assert len(logprobs.text_offset) == len(logprobs.tokens)
    for token, logprob, alternatives in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert logprob <= 0
        # The likeliest `top` and the sampled token: up to top + 1 of them, as OpenAI says.
        assert token in alternatives and top <= len(alternatives) <= top + 1
        assert alternatives[token] == pytest.approx(logprob)
    for token, start in zip(logprobs.tokens, logprobs.text_offset, strict=True):
        assert start == offset
        offset += len(token)


@pytest.mark.engine
async def test_a_text_completion_gives_legacy_logprobs(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    completion = await client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, logprobs=2, temperature=0
    )
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == 6
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert_legacy(logprobs, top=2)


@pytest.mark.engine
async def test_a_streamed_text_completion_continues_its_offsets_across_chunks(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    stream = await client.completions.create(
        model=MODEL, prompt="One, two, three,", max_tokens=8, logprobs=1, stream=True, temperature=0
    )
    text, offset, tokens = "", 0, 0
    async for chunk in stream:
        for choice in chunk.choices:
            assert_legacy(choice.logprobs, top=1, offset=offset)
            offset += sum(len(token) for token in choice.logprobs.tokens)
            tokens += len(choice.logprobs.tokens)
            text += choice.text
    assert tokens == 8 and offset == len(text)


def test_the_legacy_shape_keeps_the_sampled_token_beside_the_likeliest():
    tokens = [
        {"token": " Paris", "logprob": -0.5, "top": [[" the", -0.4]]},
        {"token": ".", "logprob": float("-inf"), "top": []},
    ]
    assert wire.text_logprobs(tokens, offset=3) == {
        "tokens": [" Paris", "."],
        "token_logprobs": [-0.5, wire.LOGPROB_FLOOR],
        "top_logprobs": [{" the": -0.4, " Paris": -0.5}, {".": wire.LOGPROB_FLOOR}],
        "text_offset": [3, 9],
    }
