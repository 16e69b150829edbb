"""/metrics: what a chat message and an API call change, and who may read it."""

from __future__ import annotations

import asyncio

import openai
import pytest
from channels.db import database_sync_to_async

from accounts.services import api_key_create
from tests.helpers.sockets import drain_until_finished, open_socket
from tests.observability.conftest import engine_metrics_url, scrape, total

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"


async def until_changed(url: str, name: str, before: float, *, timeout: float = 15, **labels: str) -> float:
    """`name`'s total once it differs from `before` (a worker records an end just after announcing it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        now = total(await scrape(url), name, **labels)
        if now != before or asyncio.get_running_loop().time() > deadline:
            return now
        await asyncio.sleep(0.2)


@pytest.mark.topology
async def test_a_chat_message_and_an_api_call_move_the_counters_and_histograms(engine, chat_server, alice):
    engine_url = engine_metrics_url(engine, chat_server)
    before = await scrape(engine_url)

    socket, connected = await open_socket(alice)
    assert connected
    await socket.send_json_to({"type": "message.send", "content": "Say hello in five words."})
    events = await drain_until_finished(socket)
    assert events[-1]["type"] == "generation.done", events[-1]
    await until_changed(
        engine_url, "chatsite_requests_total", total(before, "chatsite_requests_total", channel="chat"), channel="chat"
    )

    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="m", scopes=["chat"]).key)()
    client = openai.AsyncOpenAI(base_url=f"{chat_server}/v1", api_key=key, max_retries=0, timeout=120)
    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8)
    await until_changed(
        engine_url,
        "chatsite_requests_total",
        total(before, "chatsite_requests_total", channel="openai_api"),
        channel="openai_api",
    )
    after = await scrape(engine_url)

    for channel in ("chat", "openai_api"):
        labels = {"channel": channel, "deployment": MODEL}
        for histogram in (
            "chatsite_time_to_first_token_seconds_count",
            "chatsite_end_to_end_seconds_count",
            "chatsite_queue_wait_seconds_count",
        ):
            assert total(after, histogram, **labels) == total(before, histogram, **labels) + 1, (histogram, channel)
        assert total(after, "chatsite_end_to_end_seconds_sum", **labels) > total(
            before, "chatsite_end_to_end_seconds_sum", **labels
        )
        assert total(after, "chatsite_completion_tokens_total", **labels) > total(
            before, "chatsite_completion_tokens_total", **labels
        )
        assert (
            total(after, "chatsite_requests_total", **labels) == total(before, "chatsite_requests_total", **labels) + 1
        )
    # The tier is the user's plan, named.
    assert total(after, "chatsite_requests_total", channel="chat", tier="") == total(
        before, "chatsite_requests_total", channel="chat", tier=""
    )

    web = await scrape(f"{chat_server}/metrics")
    assert "chatsite_queue_depth" in web or total(web, "chatsite_generations_running") == 0
    assert total(web, "chatsite_workers", deployment=f"{MODEL}:scripted", state="ready") >= 1


@pytest.mark.django_db(transaction=False)
@pytest.mark.topology
def test_a_refused_api_call_is_counted_as_rate_limited_on_its_channel(client, alice):
    from accounts.models import Tier
    from accounts.selectors import tier_for_user

    Tier.objects.filter(id=tier_for_user(user=alice).id).update(model_lists_per_minute=1)
    key = api_key_create(user=alice, name="m", scopes=["models:read"]).key

    def refused() -> float:
        page = client.get("/metrics").content.decode()
        samples = {}
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
        return total(
            samples, "chatsite_requests_total", channel="openai_api", outcome="rate_limited", code="rate_limited"
        )

    before = refused()
    assert client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    assert client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 429
    assert refused() == before + 1


@pytest.mark.parametrize(
    "headers, remote, expected",
    [
        ({}, "8.8.4.4", 403),  # a public address, no token configured
        ({"HTTP_X_FORWARDED_FOR": "8.8.4.4"}, "127.0.0.1", 403),  # through a proxy: may be anyone
        ({}, "127.0.0.1", 200),
        ({}, "10.1.2.3", 200),
    ],
)
def test_without_a_token_only_internal_addresses_read_metrics(client, headers, remote, expected):
    response = client.get("/metrics", REMOTE_ADDR=remote, **headers)
    assert response.status_code == expected
    if expected == 200:
        assert b"chatsite_requests_total" in response.content or b"chatsite_queue_depth" in response.content


def test_with_a_token_only_its_bearer_reads_metrics(client, settings):
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token", REMOTE_ADDR="8.8.4.4")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")


@pytest.mark.engine
@pytest.mark.topology
async def test_vllms_own_figures_are_on_the_metrics_of_the_process_hosting_the_engine(engine, chat_server, alice):
    """vLLM's stat loggers register in the process that hosts the engine: the web process in the
    embedded default, the GPU worker's own endpoint in the production topology. The same prompt
    twice: the second finds the first's blocks in the prefix cache."""
    engine_url = engine_metrics_url(engine, chat_server)
    before = await scrape(engine_url)
    key = await database_sync_to_async(lambda: api_key_create(user=alice, name="v", scopes=["chat"]).key)()
    client = openai.AsyncOpenAI(base_url=f"{chat_server}/v1", api_key=key, max_retries=0, timeout=120)
    # Long enough to fill several whole KV blocks, which is what the prefix cache keeps.
    prompt = "Repeat after me: " + " ".join(f"word{i}" for i in range(200))
    for _ in range(2):
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=4)
    after = await scrape(engine_url)

    labels = {"model_name": MODEL}
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        shown = {dict(key).get("model_name") for key in after.get(gauge, {})}
        assert MODEL in shown, (gauge, shown)
    assert 0 <= total(after, "vllm:kv_cache_usage_perc", **labels) <= 1
    assert (
        total(after, "vllm:request_success_total", **labels)
        >= total(before, "vllm:request_success_total", **labels) + 2
    )
    queries = total(after, "vllm:prefix_cache_queries_total", **labels) - total(
        before, "vllm:prefix_cache_queries_total", **labels
    )
    hits = total(after, "vllm:prefix_cache_hits_total", **labels) - total(
        before, "vllm:prefix_cache_hits_total", **labels
    )
    assert queries >= 400, queries  # both prompts' tokens were looked up
    assert hits > 0, hits  # the second prompt's whole blocks were found


def test_the_first_engine_of_a_process_keeps_vllms_figures_and_later_ones_start_without(monkeypatch):
    """vLLM keeps one engine's figures per process (each new stat logger unregisters the others'):
    a second deployment started later must not silently replace the first's."""
    from inference.engine import host
    from inference.engine.host import EngineSpec, vllm_figures_claim

    monkeypatch.setattr(host, "_vllm_figures_of", None)
    first, second = (
        EngineSpec(name="first", model_path="m", max_context=64),
        EngineSpec(name="second", model_path="m", max_context=64),
    )
    off = EngineSpec(name="off", model_path="m", max_context=64, extra_args={"disable_log_stats": True})
    assert vllm_figures_claim(off, off.engine_args())["disable_log_stats"] is True  # claims nothing
    assert vllm_figures_claim(first, first.engine_args())["disable_log_stats"] is False
    assert vllm_figures_claim(second, second.engine_args())["disable_log_stats"] is True
    assert vllm_figures_claim(first, first.engine_args())["disable_log_stats"] is False  # its restart
