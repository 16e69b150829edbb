"""Tool calling on the OpenAI API, driven by the official `openai` client against the real engine."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from inference.engine.tokenizers import render_chat, tokenizer_for
from inference.models import Generation, ModelDeployment
from inference.openai.services import newest_user_text
from inference.openai.tools import ToolCallReader, tool_sampling

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def assert_valid_weather_call(call) -> dict:
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_PARAMETERS)
    return arguments


# --- the deployment's parser and template -------------------------------------------------------------


def test_a_deployment_names_a_parser_vllm_has_and_a_template_that_is_there(default_deployment):
    from django.core.exceptions import ValidationError

    default_deployment.full_clean()
    default_deployment.tool_parser, default_deployment.chat_template = "no-such-parser", "../settings.py"
    with pytest.raises(ValidationError) as refused:
        default_deployment.full_clean()
    assert set(refused.value.message_dict) == {"tool_parser", "chat_template"}


# --- the prompt and what reaches vLLM -------------------------------------------------------------------


def test_the_deployments_template_renders_tools_and_renders_a_chat_without_them_as_the_models_own(
    default_deployment,
):
    tokenizer = tokenizer_for(default_deployment.model_path)
    template = default_deployment.chat_template
    chat = [{"role": "system", "content": "Be brief."}, *ASK, {"role": "assistant", "content": "Sunny."}, *ASK]
    assert render_chat(tokenizer, chat, chat_template=template) == render_chat(tokenizer, chat)
    assert render_chat(tokenizer, ASK, chat_template=template) == render_chat(tokenizer, ASK)

    follow_up = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny <|im_end|>"},
    ]
    text = tokenizer.decode(render_chat(tokenizer, follow_up, tools=[WEATHER], chat_template=template))
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n18 degrees, sunny <\u2060|im_end|>\n</tool_response>" in text  # defused


def test_tool_choice_required_becomes_a_structural_tag_holding_the_calls_schema(default_deployment):
    request = {"model": MODEL, "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required"}
    sampling = tool_sampling(request, deployment=default_deployment)
    tag = json.loads(sampling["structured_outputs"]["structural_tag"])
    assert tag["format"]["at_least_one"] is True
    assert {t["content"]["json_schema"]["required"][0] for t in tag["format"]["tags"]} == {"city", "zone"}
    named = tool_sampling(
        {**request, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        deployment=default_deployment,
    )
    assert "get_weather" not in named["structured_outputs"]["structural_tag"]
    assert tool_sampling({**request, "tool_choice": "none"}, deployment=default_deployment) == {}


def test_a_tool_schema_the_grammar_cannot_hold_is_the_clients_error(default_deployment):
    from chatsite.errors import ClientError

    broken = {"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}
    request = {"model": MODEL, "messages": ASK, "tools": [broken], "tool_choice": "required"}
    with pytest.raises(ClientError) as refused:
        tool_sampling(request, deployment=default_deployment)
    assert refused.value.param == "tools"


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(alice, nothing_runs):
    from inference.openai.services import completion_create

    (with_none,) = completion_create(
        user=alice, api_key=None, request={"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "none"}
    ).generations
    (plain,) = completion_create(user=alice, api_key=None, request={"model": MODEL, "messages": ASK}).generations
    assert with_none.prompt_token_ids == plain.prompt_token_ids
    assert "structured_outputs" not in with_none.sampling


def test_a_streamed_call_reassembles_to_the_whole_answers_call(default_deployment):
    request = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "auto"}
    tokenizer = tokenizer_for(default_deployment.model_path)
    answer = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    content, (whole,) = ToolCallReader(request, deployment=default_deployment, tokenizer=tokenizer).complete(answer)
    assert content == "Let me look."
    reader = ToolCallReader(request, deployment=default_deployment, tokenizer=tokenizer)
    texts, deltas = [], []
    for start in range(0, len(answer), 7):
        text, calls = reader.delta(answer[start : start + 7])
        texts.append(text or "")
        deltas.extend(calls)
    text, calls = reader.delta("", finished=True)
    deltas.extend(calls)
    assert "".join(texts) == "Let me look."
    assert deltas[0]["index"] == 0 and deltas[0]["type"] == "function" and deltas[0]["id"]
    assert deltas[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"].get("arguments", "") for d in deltas) == whole["function"]["arguments"]
    assert reader.finish_reason("stop") == "tool_calls"


def test_tool_results_are_moderated_with_the_newest_user_message():
    request = {"messages": [*ASK, {"role": "assistant", "content": None}, {"role": "tool", "content": "18 C"}]}
    assert newest_user_text(request) == f"{ASK[0]['content']}\n\n18 C"


# --- refusals ----------------------------------------------------------------------------------------------


async def test_a_deployment_without_a_parser_refuses_tools_and_accepts_tool_choice_none(
    server_without_engine, alice, client_of, default_deployment, nothing_runs
):
    await ModelDeployment.objects.filter(pk=default_deployment.pk).aupdate(tool_parser="")
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    assert (refused.value.body["param"], refused.value.code) == ("tools", "unsupported_parameter")
    assert not await Generation.objects.aexists()
    # "none" asks for no call: accepted, and the answer is queued.
    stream = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", stream=True, timeout=5
    )
    await stream.close()
    assert await Generation.objects.aexists()


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "maybe"}, "parallel_tool_calls"),
    ],
)
async def test_invalid_tool_fields_are_refused_by_name(server_without_engine, alice, client_of, extra, param):
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=ASK, extra_body=extra)
    assert refused.value.body["param"] == param
    assert not await Generation.objects.aexists()


@pytest.mark.parametrize(
    "message",
    [
        {"role": "tool", "content": "18 C"},  # no tool_call_id
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{"}}],
        },
        {"role": "assistant", "content": None},
    ],
)
async def test_malformed_tool_turns_are_refused(server_without_engine, alice, client_of, message):
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=[*ASK, message, *ASK])
    assert refused.value.body["param"] == "messages"


# --- through the engine -----------------------------------------------------------------------------------


@pytest.mark.engine
async def test_tool_choice_required_gives_a_valid_call(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    completion = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=120, seed=1
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls, choice.message.content
    for call in choice.message.tool_calls:
        arguments = json.loads(call.function.arguments)
        schema = WEATHER_PARAMETERS if call.function.name == "get_weather" else TIME["function"]["parameters"]
        jsonschema.validate(arguments, schema)
    usage = completion.usage
    generation = await Generation.objects.aget(user=alice)
    assert usage.completion_tokens == generation.completion_tokens > 0


@pytest.mark.engine
async def test_a_named_tool_choice_calls_that_tool(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    completion = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[TIME, WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=120,
    )
    choice = completion.choices[0]
    (call,) = choice.message.tool_calls
    assert_valid_weather_call(call)
    assert choice.finish_reason == "stop"  # a named function's call ends with stop, at OpenAI and vLLM


@pytest.mark.engine
async def test_tool_choice_auto_answers_in_text_or_with_a_call(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    completion = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="auto", max_tokens=60
    )
    message = completion.choices[0].message
    assert message.content or message.tool_calls
    for call in message.tool_calls or []:
        assert_valid_weather_call(call)


@pytest.mark.engine
async def test_streamed_tool_calls_reassemble_to_a_valid_call(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=120,
        seed=3,
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    first = deltas[0]
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather") and first.id
    assert all(d.id is None and d.function.name is None for d in deltas[1:] if d.index == 0)
    arguments = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMETERS)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].usage.completion_tokens > 0


@pytest.mark.engine
async def test_a_follow_up_turn_with_the_tools_result_gets_an_answer(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    first = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=120
    )
    message = first.choices[0].message
    (call,) = message.tool_calls[:1]
    follow_up = [
        *ASK,
        message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}) | {"content": None},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})},
    ]
    second = await client.chat.completions.create(model=MODEL, messages=follow_up, tools=[WEATHER], max_tokens=40)
    answer = second.choices[0].message
    assert answer.content or answer.tool_calls
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.engine
async def test_tool_choice_none_answers_in_text(chat_server, alice, client_of):
    client = await client_of(chat_server, alice)
    completion = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=24
    )
    message = completion.choices[0].message
    assert message.content and not message.tool_calls
    assert completion.choices[0].finish_reason in ("stop", "length")
