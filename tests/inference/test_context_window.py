"""The default deployment serves its model's whole window, so a frontend that sends dozens of tools
with every message (Open WebUI, as shipped) is answered; tools that still do not fit a capped window
are refused in words a person can act on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import openai
import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from accounts.defaults import DEFAULT_TIERS
from accounts.models import Tier
from accounts.services import request_limits
from billing.models import UsageRecord
from chatsite.parsers import validated_json_body
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME
from inference.engine.host import engine_environment_set
from inference.models import Generation, ModelDeployment
from inference.openai.apis import ChatCompletionInputSerializer
from inference.openai.services import completion_create

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"
# The 36 built-in tools Open WebUI attaches to every message (about 24 KB of JSON, 6,200 tokens).
OPEN_WEBUI_TOOLS = json.loads((Path(__file__).parent / "fixtures" / "open_webui_tools.json").read_text())
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _model_config() -> dict:
    path = Path(settings.INFERENCE_MODELS_DIR) / DEFAULT_DEPLOYMENT_FIELDS["model"] / "config.json"
    return json.loads(path.read_text())


def test_the_default_deployment_serves_the_models_own_window(default_deployment, alice):
    window = _model_config()["max_position_embeddings"]
    assert default_deployment.max_context == DEFAULT_DEPLOYMENT_FIELDS["max_context"] == window
    # No default plan caps it below: the free plan's window is the model's.
    assert request_limits(user=alice, deployment=default_deployment).max_context == window
    assert all((tier.get("max_context") or window) >= window for tier in DEFAULT_TIERS.values())


def test_the_default_kv_cache_holds_the_default_window_in_float32(monkeypatch):
    """vLLM refuses to start an engine whose KV cache cannot hold one whole window."""
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    engine_environment_set()
    space = float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * 2**30
    config = _model_config()
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4  # keys and values
    assert per_token * DEFAULT_DEPLOYMENT_FIELDS["max_context"] <= space


def test_open_webuis_tools_fit_the_default_deployment_on_the_free_plan(alice, default_deployment, nothing_runs):
    assert len(OPEN_WEBUI_TOOLS) == 36 and len(json.dumps(OPEN_WEBUI_TOOLS)) > 20_000
    payload = {"model": MODEL, "messages": QUESTION, "tools": OPEN_WEBUI_TOOLS, "stream": True}
    request = validated_json_body(json.dumps(payload).encode(), ChatCompletionInputSerializer)
    (generation,) = completion_create(user=alice, api_key=None, request=request).generations
    assert 6_000 < generation.prompt_tokens
    assert generation.prompt_tokens + generation.sampling["max_tokens"] <= default_deployment.max_context


async def test_tools_over_a_capped_window_are_refused_in_words_a_person_can_act_on(
    server_without_engine, alice, client_of
):
    await ModelDeployment.objects.filter(name=DEFAULT_DEPLOYMENT_NAME).aupdate(max_context=2048)
    client = await client_of(server_without_engine, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=QUESTION, tools=OPEN_WEBUI_TOOLS)
    error = refused.value.body
    assert (error["code"], error["param"]) == ("context_length_exceeded", "tools")
    assert "The 36 tools sent with this request take about 6," in error["message"]
    assert "2,048-token window" in error["message"]
    assert 'tool_choice "none"' in error["message"]
    assert not await Generation.objects.aexists()
    assert not await UsageRecord.objects.aexists()


async def test_messages_too_long_without_their_tools_get_the_usual_refusal(server_without_engine, alice, client_of):
    await ModelDeployment.objects.filter(name=DEFAULT_DEPLOYMENT_NAME).aupdate(max_context=256)
    client = await client_of(server_without_engine, alice)
    long = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=long, tools=OPEN_WEBUI_TOOLS[:2])
    assert (refused.value.code, refused.value.body["param"]) == ("context_length_exceeded", "messages")


# --- the migrations that give existing installations the window -----------------------------------------


def test_the_default_deployment_and_the_free_plan_move_to_the_model_window_and_a_chosen_one_stays(
    latest_schema_after,
):
    before = [
        ("inference", "0012_deployment_memory_and_cache_generation_cached"),
        ("accounts", "0008_usage_kinds_summary_and_cached"),
    ]
    after = [("inference", "0013_default_deployment_model_window"), ("accounts", "0009_free_tier_model_window")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    apps = executor.loader.project_state(before).apps
    old_deployment, old_tier = apps.get_model("inference", "ModelDeployment"), apps.get_model("accounts", "Tier")
    old_deployment.objects.update_or_create(name=DEFAULT_DEPLOYMENT_NAME, defaults={"max_context": 2048})
    old_deployment.objects.create(name="chosen", model="SmolLM2-135M-Instruct", max_context=2048)
    old_tier.objects.filter(name="free").update(max_context=2048)
    old_tier.objects.filter(name="pro").update(max_context=2048)  # an admin's choice

    executor = MigrationExecutor(connection)
    executor.migrate(after)

    windows = dict(
        ModelDeployment.objects.filter(name__in=[DEFAULT_DEPLOYMENT_NAME, "chosen"]).values_list("name", "max_context")
    )
    assert windows == {DEFAULT_DEPLOYMENT_NAME: 8192, "chosen": 2048}
    caps = dict(Tier.objects.filter(name__in=["free", "pro"]).values_list("name", "max_context"))
    assert caps == {"free": 8192, "pro": 2048}
