"""The scripted engine (inference/engine/scripted.py) through the service's real paths: the chat
socket, the official `openai` client against the served app, the ledger, /readyz and a Celery worker.
It answers without a model, so each of these runs in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.test import AsyncClient

from accounts.models import Tier
from billing.models import UsageRecord
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME, DEFAULT_DEPLOYMENT_TOOL_FIELDS
from inference.engine import host as engine_host
from inference.engine.host import EngineState, ScriptedEngineHost, engine_host_for, engine_hosts
from inference.engine.scripted import PASSAGE
from inference.engine.tokenizers import count_tokens, tokenizer_for
from inference.execution.dispatch import local_backend
from inference.models import Generation, ModelDeployment
from inference.selectors import engine_spec_for
from tests.helpers.engines import SCRIPTED_DEFAULT
from tests.helpers.sockets import BROADCASTS, drain_until_finished, next_event, open_socket

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPTED = "scripted-demo"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def scripted_deployment_create(name: str = SCRIPTED) -> ModelDeployment:
    """A deployment of the default model's files on the scripted engine, which every tier may use."""
    deployment = ModelDeployment.objects.create(
        name=name,
        engine=ModelDeployment.Engine.SCRIPTED,
        **{**DEFAULT_DEPLOYMENT_FIELDS, **DEFAULT_DEPLOYMENT_TOOL_FIELDS},
    )
    for tier in Tier.objects.all():
        tier.deployments.add(deployment)
    return deployment


@pytest.fixture
async def scripted(settings):
    """The scripted deployment, served by this process's runner (the embedded default) as fast as
    the loop turns; its host is forgotten afterwards, so each test's pace is its own."""
    if settings.INFERENCE_BACKEND != "local":
        pytest.skip("the embedded default's runner serves these; the worker test covers Celery")
    settings.INFERENCE_SCRIPTED_TOKENS_PER_S = 0
    deployment = await database_sync_to_async(scripted_deployment_create)()
    started_here = local_backend.runner is None
    if started_here:
        # Host no vLLM engine here: only the scripted one, which the runner opens on first use.
        settings.INFERENCE_LOCAL_DEPLOYMENTS = []
        await local_backend.start()
    yield deployment
    for name in [n for n in engine_hosts() if n.startswith("scripted-")]:
        await engine_host._hosts.pop(name).aclose()
    if started_here and local_backend._keeping_alive is not None:
        local_backend._keeping_alive.cancel()
        local_backend.runner = None


def expected_answer(question: str) -> str:
    return f'You said "{question}". {PASSAGE}'


def scripted_tokens(text: str) -> int:
    """The answer's tokens in the deployment's tokenizer, and its end of sequence."""
    return count_tokens(tokenizer_for(ModelDeployment(model=DEFAULT_DEPLOYMENT_FIELDS["model"]).model_path), text) + 1


async def socket_answer(user, content: str, **fields):
    socket, connected = await open_socket(user)
    assert connected
    await socket.send_json_to({"type": "message.send", "content": content, "model": SCRIPTED, **fields})
    accepted = await next_event(socket, skipping=(*BROADCASTS, "conversation.created"))
    assert accepted["type"] == "message.accepted", accepted
    return socket, accepted


# --- the chat socket ------------------------------------------------------------------------------------


async def test_a_socket_answer_streams_the_scripted_text_and_is_charged_in_the_ledger(scripted, alice):
    socket, accepted = await socket_answer(alice, "What is the capital of France?")
    events = await drain_until_finished(socket, timeout=30)

    assert accepted["model"] == "scripted-demo:scripted"
    deltas = [e for e in events if e["type"] == "generation.delta"]
    done = events[-1]
    assert len(deltas) >= 1 and done["type"] == "generation.done", events
    answer = expected_answer("What is the capital of France?")
    assert "".join(d["text"] for d in deltas) == answer
    assert [d["seq"] for d in deltas] == sorted(d["seq"] for d in deltas)
    assert (done["status"], done["finish_reason"]) == ("complete", "stop")

    generation = await Generation.objects.aget(id=accepted["generation"])
    assert generation.text == answer
    assert done["usage"]["prompt_tokens"] == generation.prompt_tokens == len(generation.prompt_token_ids) > 0
    assert done["usage"]["completion_tokens"] == generation.completion_tokens == scripted_tokens(answer)
    record = await UsageRecord.objects.aget(generation=generation)
    assert (record.prompt_tokens, record.completion_tokens, record.deployment_id) == (
        generation.prompt_tokens,
        generation.completion_tokens,
        scripted.id,
    )


async def test_a_stop_ends_the_scripted_answer_at_once_and_frees_the_engine(scripted, alice, settings):
    settings.INFERENCE_SCRIPTED_TOKENS_PER_S = 20  # about three seconds for the whole answer
    socket, accepted = await socket_answer(alice, "Tell me a long story.")
    first = await next_event(socket, timeout=30)
    assert first["type"] == "generation.delta", first
    await socket.send_json_to({"type": "generation.stop", "generation": accepted["generation"]})
    stopped_at = time.monotonic()
    events = await drain_until_finished(socket, timeout=30)

    assert events[-1]["type"] == "generation.done" and events[-1]["status"] == "stopped", events
    assert time.monotonic() - stopped_at < 1.0
    generation = await Generation.objects.aget(id=accepted["generation"])
    assert (generation.status, generation.finish_reason) == ("stopped", "abort")
    assert 0 < generation.completion_tokens < scripted_tokens(expected_answer("Tell me a long story."))
    assert engine_hosts()[f"{SCRIPTED}:scripted"].unfinished_requests() == 0


# --- the OpenAI API, with the official client ----------------------------------------------------------


async def test_the_official_client_gets_a_marked_model_name_the_text_and_its_usage(
    scripted, server_without_engine, alice, client_of, default_deployment
):
    # Beside a deployment on vLLM (listed only, never asked).
    await ModelDeployment.objects.filter(id=default_deployment.id).aupdate(engine=ModelDeployment.Engine.VLLM)
    client = await client_of(server_without_engine, alice)
    whole = await client.chat.completions.create(
        model=SCRIPTED, messages=[{"role": "user", "content": "Hello there"}], max_tokens=200
    )
    chunks = [
        chunk
        async for chunk in await client.chat.completions.create(
            model=SCRIPTED,
            messages=[{"role": "user", "content": "Hello there"}],
            max_tokens=200,
            stream=True,
            stream_options={"include_usage": True},
        )
    ]

    answer = expected_answer("Hello there")
    assert whole.model == "scripted-demo:scripted"
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (answer, "stop")
    assert whole.usage.completion_tokens == scripted_tokens(answer)
    assert {chunk.model for chunk in chunks} == {"scripted-demo:scripted"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].usage.model_dump(include={"prompt_tokens", "completion_tokens"}) == whole.usage.model_dump(
        include={"prompt_tokens", "completion_tokens"}
    )
    assert await UsageRecord.objects.filter(user=alice, deployment=scripted).acount() == 2

    listed = {model.id: model.owned_by for model in (await client.models.list()).data}
    assert listed[SCRIPTED] == "chatsite:scripted"
    assert listed[DEFAULT_DEPLOYMENT_NAME] == "chatsite"


async def test_max_tokens_ends_a_scripted_answer_with_length(scripted, server_without_engine, alice, client_of):
    client = await client_of(server_without_engine, alice)
    answer = await client.chat.completions.create(
        model=SCRIPTED, messages=[{"role": "user", "content": "Hello there"}], max_tokens=5
    )
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 5
    assert expected_answer("Hello there").startswith(answer.choices[0].message.content)


async def test_write_on_in_the_user_turn_makes_an_answer_that_ends_only_at_max_tokens(
    scripted, server_without_engine, alice, client_of
):
    client = await client_of(server_without_engine, alice)
    asked = "Tell me a long story [write on]"
    answer = await client.chat.completions.create(
        model=SCRIPTED, messages=[{"role": "user", "content": asked}], max_tokens=300
    )
    assert (answer.choices[0].finish_reason, answer.usage.completion_tokens) == ("length", 300)
    text = answer.choices[0].message.content
    assert text.startswith(expected_answer(asked)) and text.count(PASSAGE) >= 2


async def test_a_stop_string_ends_a_scripted_answer_before_it(scripted, server_without_engine, alice, client_of):
    client = await client_of(server_without_engine, alice)
    answer = await client.chat.completions.create(
        model=SCRIPTED, messages=[{"role": "user", "content": "Hello there"}], max_tokens=200, stop=["steady"]
    )
    streamed = [
        chunk.choices[0].delta.content or ""
        async for chunk in await client.chat.completions.create(
            model=SCRIPTED,
            messages=[{"role": "user", "content": "Hello there"}],
            max_tokens=200,
            stop=["steady"],
            stream=True,
        )
        if chunk.choices
    ]
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop"
    assert expected_answer("Hello there").startswith(text) and text.endswith("at a ")
    assert "".join(streamed) == text


@pytest.mark.parametrize(
    ("choice", "finish_reason"),
    [("required", "tool_calls"), ({"type": "function", "function": {"name": "get_weather"}}, "stop")],
)
async def test_a_forced_tool_call_comes_in_the_deployments_format(
    scripted, server_without_engine, alice, client_of, choice, finish_reason
):
    client = await client_of(server_without_engine, alice)
    answer = await client.chat.completions.create(
        model=SCRIPTED,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice=choice,
        max_tokens=100,
    )
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == finish_reason
    assert [call.function.name for call in message.tool_calls] == ["get_weather"]
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "scripted"}
    generation = await Generation.objects.aget(user=alice)
    assert generation.text.startswith("<tool_call>")  # hermes, the deployment's tool_parser


async def test_a_user_turn_asks_for_a_call_when_the_model_may_choose(scripted, server_without_engine, alice, client_of):
    client = await client_of(server_without_engine, alice)
    messages = [{"role": "user", "content": "Look it up. [call get_weather]"}]
    called = await client.chat.completions.create(
        model=SCRIPTED, messages=messages, tools=[WEATHER], tool_choice="auto", max_tokens=100
    )
    streamed = [
        chunk
        async for chunk in await client.chat.completions.create(
            model=SCRIPTED, messages=messages, tools=[WEATHER], max_tokens=100, stream=True
        )
    ]
    plain = await client.chat.completions.create(
        model=SCRIPTED,
        messages=[{"role": "user", "content": "Just talk."}],
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=100,
    )

    assert called.choices[0].finish_reason == "tool_calls"
    assert called.choices[0].message.tool_calls[0].function.name == "get_weather"
    calls = [call for c in streamed if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(call.function.arguments or "" for call in calls)) == {"city": "scripted"}
    assert [c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert plain.choices[0].message.tool_calls in (None, [])
    assert plain.choices[0].message.content == expected_answer("Just talk.")


async def test_a_response_format_and_log_probabilities_are_honoured(scripted, server_without_engine, alice, client_of):
    client = await client_of(server_without_engine, alice)
    schema = {
        "type": "object",
        "properties": {"name": {"enum": ["Paris", "Lima"]}, "population": {"type": "integer"}},
        "required": ["name", "population"],
        "additionalProperties": False,
    }
    city = await client.chat.completions.create(
        model=SCRIPTED,
        messages=[{"role": "user", "content": "A capital, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
        max_tokens=60,
    )
    offered_tools = await client.chat.completions.create(
        model=SCRIPTED,
        messages=[{"role": "user", "content": "A capital, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        tools=[WEATHER],
        max_tokens=60,
    )
    certain = await client.chat.completions.create(
        model=SCRIPTED, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, logprobs=True, top_logprobs=1
    )

    assert json.loads(city.choices[0].message.content) == {"name": "Paris", "population": 1}
    assert json.loads(offered_tools.choices[0].message.content) == {"name": "Paris", "population": 1}
    assert not offered_tools.choices[0].message.tool_calls
    tokens = certain.choices[0].logprobs.content
    assert "".join(t.token for t in tokens) == certain.choices[0].message.content
    assert [t.logprob for t in tokens] == [0.0] * 6


# --- what the deployment says it is ---------------------------------------------------------------------


async def test_readyz_names_the_engine_each_deployment_runs_on(scripted, default_deployment):
    await ModelDeployment.objects.filter(id=default_deployment.id).aupdate(is_enabled=False)
    await engine_host_for(await database_sync_to_async(engine_spec_for)(scripted)).wait_ready(timeout=30)

    response = await AsyncClient().get("/readyz")
    engines = response.json()["checks"]["engines"]
    assert response.status_code == 200, response.json()
    assert engines["deployments"] == {SCRIPTED: "ready"}
    assert engines["engines"] == {SCRIPTED: "scripted"}


def test_inference_engine_puts_every_deployment_on_the_scripted_engine(default_deployment, settings):
    default_deployment.engine = ModelDeployment.Engine.VLLM
    assert engine_spec_for(default_deployment).engine == "vllm"
    assert default_deployment.answer_model == DEFAULT_DEPLOYMENT_NAME
    settings.INFERENCE_ENGINE = "scripted"
    assert engine_spec_for(default_deployment).engine == "scripted"
    assert default_deployment.answer_model == f"{DEFAULT_DEPLOYMENT_NAME}:scripted"


async def test_the_scripted_engine_starts_at_once_and_keeps_its_pace(scripted, settings):
    settings.INFERENCE_SCRIPTED_TOKENS_PER_S = 50
    spec = await database_sync_to_async(engine_spec_for)(scripted)
    host = engine_host_for(spec)
    started = time.monotonic()
    await host.wait_ready(timeout=30)
    assert isinstance(host, ScriptedEngineHost) and host.state is EngineState.READY
    assert time.monotonic() - started < 2.0  # the tokenizer, loaded once per process

    started = time.monotonic()
    deltas = [
        delta
        async for delta in host.stream(request_id="paced", prompt_token_ids=[1, 2, 3], sampling={"max_tokens": 10})
    ]
    elapsed = time.monotonic() - started
    assert [d.completion_tokens for d in deltas] == list(range(1, 11))
    assert deltas[-1].finish_reason == "length" and deltas[-1].prompt_tokens == 3
    assert 0.18 <= elapsed < 1.0

    # Without max_tokens, an answer that may not end runs to the window's end, as on vLLM.
    endless = [
        delta
        async for delta in host.stream(request_id="endless", prompt_token_ids=[1] * 8180, sampling={"ignore_eos": True})
    ]
    assert (endless[-1].completion_tokens, endless[-1].finish_reason) == (scripted.max_context - 8180, "length")


def test_the_engine_hosts_import_nothing_of_vllm():
    """vLLM is imported when a vLLM engine is built, never for the scripted one: a demo or a load
    test needs no vLLM installed (the tokenizer comes from transformers)."""
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, inference.engine.host, inference.engine.scripted; print(sorted(sys.modules))",
        ],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "'inference.engine.scripted'" in imported
    assert "vllm" not in imported and "torch" not in imported


# --- the production topology -----------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.skipif(settings.INFERENCE_BACKEND != "celery", reason="needs the production topology (REDIS_URL)")
async def test_a_celery_worker_hosts_the_scripted_engine(engine, alice):
    # The run's worker (`celery_engine_worker`), hosting the default deployment on the scripted engine
    # as its row says: a worker of this test's own would cost a start, longer than the rest of it.
    socket, accepted = await socket_answer(alice, "Hello worker", model=DEFAULT_DEPLOYMENT_NAME)
    events = await drain_until_finished(socket, timeout=30)
    assert accepted["model"] == SCRIPTED_DEFAULT
    assert "".join(e["text"] for e in events if e["type"] == "generation.delta") == expected_answer("Hello worker")
    assert events[-1]["type"] == "generation.done" and events[-1]["finish_reason"] == "stop"
    generation = await Generation.objects.aget(id=accepted["generation"])
    assert generation.worker.startswith(engine.node)
    assert await UsageRecord.objects.filter(generation=generation).aexists()
    assert engine.status()["dtypes"] == {SCRIPTED_DEFAULT: "scripted"}
