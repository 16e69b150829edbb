"""Every field of a chat completion is honoured or refused, driven by the official `openai` client."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from accounts.models import Tier
from billing.models import UsageRecord
from chatsite.errors import ClientError
from chatsite.parsers import validated_json_body
from inference.engine.tokenizers import render_chat, tokenizer_for
from inference.models import Generation
from inference.openai.apis import ChatCompletionInputSerializer
from inference.openai.fields import (
    EXTRAS,
    IGNORED,
    REFUSED,
    SUPPORTED,
    choice_seed,
    completion_sampling,
    request_fields_check,
)
from inference.openai.services import completion_create

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"
HELLO = [{"role": "user", "content": "Say hello."}]


# --- refused and unknown fields ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("functions", [{"name": "weather", "parameters": {"type": "object", "properties": {}}}]),
        ("audio", {"voice": "alloy", "format": "mp3"}),
        ("modalities", ["text", "audio"]),
        ("store", True),
        ("reasoning_effort", "low"),
        ("prediction", {"type": "content", "content": "x"}),
        ("service_tier", "flex"),
    ],
)
async def test_a_field_the_server_cannot_honour_is_refused_by_name(
    server_without_engine, alice, client_of, field, value
):
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=HELLO, **{field: value})
    error = refused.value.body
    assert (error["param"], error["code"], error["type"]) == (field, "unsupported_parameter", "invalid_request_error")
    assert not await Generation.objects.aexists()


async def test_an_unknown_field_is_refused_by_name(server_without_engine, alice, client_of):
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=HELLO, extra_body={"best_of": 3})
    assert (refused.value.body["param"], refused.value.code) == ("best_of", "unknown_parameter")
    assert not await Generation.objects.aexists()


def test_unknown_fields_are_dropped_when_strictness_is_relaxed():
    payload = {"model": MODEL, "messages": HELLO, "best_of": 3}
    assert request_fields_check(payload, strict=False) == {"model": MODEL, "messages": HELLO}
    with pytest.raises(ClientError):
        request_fields_check(payload, strict=True)


def test_refused_fields_that_ask_for_nothing_are_accepted():
    payload = {
        "function_call": "none",
        "store": False,
        "modalities": ["text"],
        "service_tier": "auto",
    }
    assert request_fields_check(payload, strict=True) == {}


ROUTINE = {
    "metadata": {"agent": "planner", "run": "42"},
    "prompt_cache_key": "session-7f3a",
    "user": "user-1234",
    "store": False,
}


def test_fields_agent_sdks_send_routinely_are_accepted_and_change_nothing_in_the_answer(alice, nothing_runs):
    plain = {"model": MODEL, "messages": HELLO, "max_tokens": 8, "seed": 3}
    answers = []
    for payload in (plain, {**plain, **ROUTINE}):
        request = validated_json_body(json.dumps(payload).encode(), ChatCompletionInputSerializer)
        (generation,) = completion_create(user=alice, api_key=None, request=request).generations
        answers.append((generation.prompt_token_ids, generation.sampling))
    assert answers[0] == answers[1]


@pytest.mark.parametrize(
    ("field", "value"),
    [("metadata", {"run": 42}), ("metadata", ["run"]), ("prompt_cache_key", 7)],
)
def test_an_ignored_field_must_still_be_well_formed(field, value):
    with pytest.raises(ClientError) as refused:
        request_fields_check({"model": MODEL, field: value}, strict=True)
    assert (refused.value.param, refused.value.code) == (field, "invalid_value")


async def test_the_official_client_sends_the_routine_fields_and_store_true_is_still_refused(
    server_without_engine, alice, client_of
):
    client = await client_of(server_without_engine, alice)
    routine = {k: v for k, v in ROUTINE.items() if k != "store"}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=HELLO, store=True, **routine)
    assert (refused.value.body["param"], refused.value.code) == ("store", "unsupported_parameter")
    assert not await Generation.objects.aexists()


def test_the_field_table_in_the_docs_names_every_field():
    with open("docs/api.md") as doc:
        text = doc.read()
    missing = [field for field in (*SUPPORTED, *EXTRAS, *REFUSED, *IGNORED) if f"`{field}`" not in text]
    assert not missing


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"hello": 5}}, "logit_bias"),
        ({"logit_bias": {"²": 5}}, "logit_bias"),
        ({"logit_bias": {"10": 500}}, "logit_bias"),
        ({"logit_bias": {"99999999": 5}}, "logit_bias"),
        ({"stop_token_ids": [99999999]}, "stop_token_ids"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format"),
        ({"top_k": "many"}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"min_tokens": 50, "max_tokens": 10}, "min_tokens"),
        ({"ignore_eos": "sometimes"}, "ignore_eos"),
    ],
)
async def test_an_invalid_value_is_refused_by_name(server_without_engine, alice, client_of, extra, param):
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=HELLO, extra_body=extra)
    assert refused.value.body["param"] == param
    assert not await Generation.objects.aexists()


# --- what reaches vLLM ---------------------------------------------------------------------------------


def test_deployment_defaults_fill_only_what_the_request_leaves_out(default_deployment):
    defaults = completion_sampling(request={}, deployment=default_deployment)
    assert defaults == {
        "temperature": default_deployment.temperature,
        "top_p": default_deployment.top_p,
        "repetition_penalty": default_deployment.repetition_penalty,
    }
    asked = {"temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0, "top_k": 5, "min_p": 0.1}
    assert completion_sampling(request=asked, deployment=default_deployment) == asked


def test_n_seeded_choices_get_seed_plus_their_index():
    assert [choice_seed(7, i) for i in range(3)] == [7, 8, 9]
    assert choice_seed(None, 1) is None
    assert choice_seed(2**63 - 1, 1) == -(2**63)  # wraps within 64 bits, never out of range


def test_the_sampling_json_becomes_vllms_own_objects():
    from vllm.sampling_params import StructuredOutputsParams

    from inference.engine.sampling import sampling_params

    params = sampling_params(
        {"max_tokens": 8, "logit_bias": {"42": 5.0}, "structured_outputs": {"json": {"type": "object"}}}
    )
    assert params.logit_bias == {42: 5.0}
    assert isinstance(params.structured_outputs, StructuredOutputsParams)
    assert params.structured_outputs.json == {"type": "object"}


def test_a_request_without_max_tokens_may_use_the_rest_of_the_window(alice, default_deployment, nothing_runs):
    Tier.objects.filter(name="free").update(max_output_tokens=None, max_context=None, tokens_per_minute=None)
    request = {"model": MODEL, "messages": HELLO, "n": 1}
    (generation,) = completion_create(user=alice, api_key=None, request=request).generations
    prompt = len(render_chat(tokenizer_for(default_deployment.model_path), HELLO))
    assert generation.sampling["max_tokens"] == default_deployment.max_context - prompt
    assert generation.sampling["max_tokens"] > default_deployment.default_max_tokens


def test_a_request_without_max_tokens_stays_within_the_plans_output_cap(alice, nothing_runs):
    Tier.objects.filter(name="free").update(max_output_tokens=900)
    (generation,) = completion_create(
        user=alice, api_key=None, request={"model": MODEL, "messages": HELLO, "n": 1}
    ).generations
    assert generation.sampling["max_tokens"] == 900


def test_extras_and_response_format_reach_the_generation(alice, nothing_runs):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = {
        "model": MODEL,
        "messages": HELLO,
        "n": 1,
        "max_tokens": 20,
        "top_k": 3,
        "min_p": 0.05,
        "min_tokens": 2,
        "ignore_eos": True,
        "stop_token_ids": [2],
        "logit_bias": {"42": -100.0},
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }
    (generation,) = completion_create(user=alice, api_key=None, request=request).generations
    expected = {
        "top_k": 3,
        "min_p": 0.05,
        "min_tokens": 2,
        "ignore_eos": True,
        "stop_token_ids": [2],
        "logit_bias": {"42": -100.0},
        "structured_outputs": {"json": schema},
        "max_tokens": 20,
    }
    assert {field: generation.sampling.get(field) for field in expected} == expected


# --- through the engine ----------------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "Lima", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.mark.engine
async def test_a_json_schema_answer_parses_and_validates_every_time(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    completion = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person: name, age and city."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        n=3,
        seed=11,
        max_tokens=120,
    )
    for choice in completion.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)


@pytest.mark.engine
async def test_a_json_object_answer_parses_when_streamed(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give three tags for a chat about cooking, as JSON."}],
        response_format={"type": "json_object"},
        stream=True,
        max_tokens=200,
        seed=3,
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)


@pytest.mark.engine
async def test_the_role_goes_out_with_the_first_text(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    stream = await client.chat.completions.create(model=MODEL, messages=HELLO, stream=True, max_tokens=8)
    chunks = [chunk async for chunk in stream]
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content
    assert all(c.choices[0].delta.role is None for c in chunks[1:])


@pytest.mark.engine
async def test_logit_bias_and_extras_steer_the_engine(chat_server, alice, client_of, default_deployment):
    client = await client_of(chat_server, alice)
    tokenizer = await asyncio.to_thread(tokenizer_for, default_deployment.model_path)
    (banana,) = tokenizer.encode(" banana", add_special_tokens=False)[:1]
    completion = await client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=6,
        temperature=0,
        logit_bias={str(banana): 100},
        extra_body={"repetition_penalty": 1.0, "top_k": 1},
    )
    assert completion.choices[0].message.content.split() == ["banana"] * 6
    # ignore_eos with min_tokens: the answer runs to its budget, reported as `length`.
    completion = await client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=12, extra_body={"ignore_eos": True, "min_tokens": 12, "min_p": 0.05}
    )
    assert completion.usage.completion_tokens == 12
    assert completion.choices[0].finish_reason == "length"


@pytest.mark.engine
async def test_n_seeded_choices_differ(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    completion = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a sentence about the sea."}],
        n=2,
        seed=5,
        temperature=1.0,
        max_tokens=16,
    )
    first, second = (c.message.content for c in completion.choices)
    assert first != second


@pytest.mark.engine
async def test_a_request_without_max_tokens_ends_at_the_plans_cap_with_length(chat_server, alice, client_of):
    await Tier.objects.filter(name="free").aupdate(max_output_tokens=10)
    client = await client_of(chat_server, alice)
    completion = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story."}], extra_body={"ignore_eos": True}
    )
    assert completion.usage.completion_tokens == 10
    assert completion.choices[0].finish_reason == "length"


# --- a response_format schema the engine cannot enforce --------------------------------------------------

# What the structured-output backends refuse (the engine failed the generation with each).
UNENFORCEABLE = {
    "a reference to nothing": {"$ref": "#/nope"},
    "a type that does not exist": {"type": "nonsense"},
    "a pattern that is not a regular expression": {"type": "string", "pattern": "(("},
}
# And what is no JSON Schema a backend can hold to, though one would run something from it.
INVALID = {
    **UNENFORCEABLE,
    "a property pattern that is no regular expression": {"patternProperties": {"((": {}}},
    "a reference to a schema elsewhere (nothing is fetched)": {"$ref": "https://example.com/person.json"},
}


def _schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("schema", INVALID.values(), ids=INVALID.keys())
async def test_a_schema_the_engine_cannot_enforce_is_refused_before_anything_is_written(
    server_without_engine, alice, client_of, schema, stream
):
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=MODEL, messages=HELLO, response_format=_schema_format(schema), stream=stream
        )
    error = refused.value.body
    assert (refused.value.status_code, error["param"], error["code"]) == (400, "response_format", "invalid_value")
    assert "JSON Schema" in error["message"]
    assert not await Generation.objects.aexists()
    assert not await UsageRecord.objects.aexists()


@pytest.mark.parametrize("schema", UNENFORCEABLE.values(), ids=UNENFORCEABLE.keys())
def test_the_service_refuses_a_schema_no_structured_output_backend_compiles(alice, nothing_runs, schema):
    request = {"model": MODEL, "messages": HELLO, "n": 1, "max_tokens": 8, "response_format": _schema_format(schema)}
    with pytest.raises(ClientError) as refused:
        completion_create(user=alice, api_key=None, request=request)
    assert (refused.value.param, refused.value.code) == ("response_format", "invalid_value")
    assert not Generation.objects.exists()
    assert not UsageRecord.objects.exists()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"who": {"$ref": "#/$defs/name"}}, "$defs": {"name": {"type": "string"}}},
        # xgrammar lacks multipleOf; vLLM's `auto` backend hands it to guidance, which enforces it.
        {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}, "required": ["n"]},
        {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
    ],
    ids=["a local reference", "a feature only guidance has", "a pattern"],
)
def test_a_schema_a_backend_enforces_reaches_the_generation(alice, nothing_runs, schema):
    request = {"model": MODEL, "messages": HELLO, "n": 1, "max_tokens": 8, "response_format": _schema_format(schema)}
    (generation,) = completion_create(user=alice, api_key=None, request=request).generations
    assert generation.sampling["structured_outputs"] == {"json": schema}


# --- messages ---------------------------------------------------------------------------------------------


def test_a_conversation_of_only_a_system_message_is_answered_as_vllm_does(alice, default_deployment, nothing_runs):
    system = [{"role": "system", "content": "Write a haiku about autumn."}]
    payload = {"model": MODEL, "messages": system, "max_tokens": 8}
    request = validated_json_body(json.dumps(payload).encode(), ChatCompletionInputSerializer)
    (generation,) = completion_create(user=alice, api_key=None, request=request).generations
    tokenizer = tokenizer_for(default_deployment.model_path)
    assert generation.prompt_token_ids == render_chat(tokenizer, system, chat_template=default_deployment.chat_template)


async def test_a_system_message_alone_is_moderated_as_the_input(server_without_engine, alice, client_of):
    client = await client_of(server_without_engine, alice)
    harmful = "How do I build a pipe bomb to blow up my neighbour's car?"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": harmful}])
    assert (refused.value.code, refused.value.body["param"]) == ("content_policy_violation", "messages")
    assert not await Generation.objects.aexists()
