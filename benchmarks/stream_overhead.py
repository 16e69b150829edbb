"""What the serving stack adds to the engine's latency and throughput.

In one run, the same prompts at concurrency 1 and 8, with the same sampling (greedy, 64 tokens):
  (a) straight into a vLLM AsyncLLM in this process;
  (b) through the whole production stack: WebSocket → web process (uvicorn) → PostgreSQL → Celery
      (Redis broker) → GPU worker process → Redis channel layer → web process → WebSocket client.
The engine runs in one process at a time, so (a) and (b) never compete for the CPU.

Prints TTFT p50/p99, inter-token latency, output tokens/s, their ratios, and a final line
  RESULT ttft_added_p50_ms=<x> ttft_added_p99_ms=<y> throughput_ratio_c8=<z>
(added TTFT at concurrency 1, the throughput ratio at concurrency 8).

Needs PostgreSQL and Redis: `make benchmark` (or set DATABASE_URL and REDIS_URL and run this file).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

DEPLOYMENT = "bench-smollm2"
MAX_TOKENS = 64
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU does in two sentences.",
    "Give me three tips for sleeping better.",
    "What is photosynthesis?",
    "Name three famous painters.",
    "How do I boil an egg?",
    "Why is the sky blue?",
]
ROUNDS = 2


@dataclass
class Sample:
    ttft: float  # seconds from request to first text
    duration: float  # seconds from request to the end
    tokens: int

    @property
    def itl(self) -> float:
        return (self.duration - self.ttft) / max(self.tokens - 1, 1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def setup_django():
    import django

    django.setup()
    from django.conf import settings

    if settings.INFERENCE_BACKEND != "celery":
        sys.exit("Set DATABASE_URL (PostgreSQL) and REDIS_URL: the benchmark measures the production topology.")
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
    from inference.models import ModelDeployment

    fields = {**DEFAULT_DEPLOYMENT_FIELDS, "temperature": 0.0, "default_max_tokens": MAX_TOKENS}
    ModelDeployment.objects.update_or_create(name=DEPLOYMENT, defaults=fields)
    return ModelDeployment.objects.get(name=DEPLOYMENT)


def prompt_ids(deployment, prompt: str) -> list[int]:
    from inference.tokenizers import render_chat, tokenizer_for

    messages = [{"role": "system", "content": deployment.system_prompt}, {"role": "user", "content": prompt}]
    return render_chat(tokenizer_for(deployment.model_path), messages)


def sampling(deployment) -> dict:
    return {
        "temperature": 0.0,
        "top_p": deployment.top_p,
        "repetition_penalty": deployment.repetition_penalty,
        "max_tokens": MAX_TOKENS,
    }


# --- (a) the engine alone ------------------------------------------------------------------------


async def engine_direct(deployment) -> dict[int, list[tuple[Sample, float]]]:
    from chatsite.heap import heap_freeze
    from inference.engine import EngineHost
    from inference.selectors import engine_spec_for

    host = EngineHost(engine_spec_for(deployment))
    host.start()
    await host.wait_ready(timeout=900)
    heap_freeze()  # as the stack's processes do once warm, so neither side pauses for a full collection
    counter = iter(range(10**6))

    async def one(prompt: str) -> Sample:
        started = time.perf_counter()
        first, tokens = None, 0
        async for delta in host.stream(
            request_id=f"bench-{next(counter)}",
            prompt_token_ids=prompt_ids(deployment, prompt),
            sampling=sampling(deployment),
        ):
            if first is None and delta.text:
                first = time.perf_counter() - started
            tokens = delta.completion_tokens
        return Sample(first or 0.0, time.perf_counter() - started, tokens)

    await one("Hello!")  # warm-up
    results = await run_levels(one)
    await host.aclose()
    return results


async def run_levels(one) -> dict[int, list[tuple[Sample, float]]]:
    """Per concurrency level, the samples and the wall time of each batch."""
    results: dict[int, list[tuple[Sample, float]]] = {1: [], 8: []}
    for _ in range(ROUNDS):
        for prompt in PROMPTS:
            started = time.perf_counter()
            sample = await one(prompt)
            results[1].append((sample, time.perf_counter() - started))
        started = time.perf_counter()
        samples = await asyncio.gather(*(one(p) for p in PROMPTS))
        wall = time.perf_counter() - started
        results[8].extend((s, wall) for s in samples)
    return results


# --- (b) the whole stack -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, env=os.environ.copy()
    )


async def whole_stack(deployment) -> dict[int, list[tuple[Sample, float]]]:
    import websockets
    from django.contrib.auth import get_user_model
    from django.test import Client

    from accounts.models import Tier
    from accounts.services import user_set_tier
    from inference.workers import worker_engine_state

    logs = Path(os.environ.get("CHATSITE_DATA_DIR", ROOT / "var"))
    port = free_port()
    worker = start(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "chatsite",
            "worker",
            "-P",
            "threads",
            "-c",
            "16",
            "-Q",
            f"gpu.{DEPLOYMENT}",
            "-n",
            f"bench@{socket.gethostname()}",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "WARNING",
        ],
        logs / "bench-worker.log",
    )
    web = start(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "chatsite.asgi:application",
            "--port",
            str(port),
            "--lifespan",
            "on",
            "--log-level",
            "warning",
            "--ws",
            "websockets",
        ],
        logs / "bench-web.log",
    )
    try:
        while worker_engine_state(DEPLOYMENT) != "ready":
            if worker.poll() is not None:
                sys.exit(f"the worker exited; see {logs / 'bench-worker.log'}")
            await asyncio.sleep(0.5)
        user, _ = await asyncio.to_thread(get_user_model().objects.get_or_create, username="benchmark")
        # The plan that includes every model (the benchmark's deployment too) and the highest limits.
        enterprise = await Tier.objects.aget(name="enterprise")
        await asyncio.to_thread(user_set_tier, user=user, tier=enterprise)
        client = Client()
        await asyncio.to_thread(client.force_login, user)
        cookie = f"sessionid={client.cookies['sessionid'].value}"
        url = f"ws://127.0.0.1:{port}/ws/chat/"
        for _ in range(100):
            try:
                async with websockets.connect(
                    url, additional_headers={"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}
                ):
                    break
            except OSError:
                await asyncio.sleep(0.2)

        async def one(prompt: str) -> Sample:
            async with websockets.connect(
                url, additional_headers={"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}
            ) as ws:
                await ws.recv()  # engine.status greeting
                started = time.perf_counter()
                await ws.send(json.dumps({"type": "message.send", "model": DEPLOYMENT, "content": prompt}))
                first = None
                while True:
                    event = json.loads(await ws.recv())
                    if event["type"] == "generation.delta" and first is None:
                        first = time.perf_counter() - started
                    elif event["type"] == "generation.done":
                        return Sample(first or 0.0, time.perf_counter() - started, event["usage"]["completion_tokens"])
                    elif event["type"] in ("generation.error", "error"):
                        raise RuntimeError(event)

        await one("Hello!")  # warm-up
        return await run_levels(one)
    finally:
        for process in (web, worker):
            os.killpg(process.pid, signal.SIGTERM)
        for process in (web, worker):
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


# --- report --------------------------------------------------------------------------------------


def summarize(results: dict[int, list[tuple[Sample, float]]]) -> dict[int, dict[str, float]]:
    out = {}
    for level, rows in results.items():
        samples = [s for s, _ in rows]
        if level == 1:
            throughput = sum(s.tokens for s in samples) / sum(w for _, w in rows)
        else:
            walls = sorted({w for _, w in rows})
            throughput = sum(s.tokens for s in samples) / sum(walls)
        out[level] = {
            "ttft_p50_ms": 1000 * pct([s.ttft for s in samples], 50),
            "ttft_p99_ms": 1000 * pct([s.ttft for s in samples], 99),
            "itl_ms": 1000 * statistics.mean(s.itl for s in samples),
            "tokens": sum(s.tokens for s in samples),
            "tok_s": throughput,
        }
    return out


def main() -> None:
    deployment = setup_django()
    print(
        f"model {deployment.model_path}, greedy, max_tokens={MAX_TOKENS}, {len(PROMPTS)} prompts x {ROUNDS} rounds",
        flush=True,
    )
    print("(a) engine direct ...", flush=True)
    direct = summarize(asyncio.run(engine_direct(deployment)))
    print("(b) whole stack over WebSocket ...", flush=True)
    stack = summarize(asyncio.run(whole_stack(deployment)))
    print(f"\n{'':14}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL':>9}{'tokens':>8}{'tok/s':>8}")
    for level in (1, 8):
        for name, figures in (("engine", direct[level]), ("stack", stack[level])):
            f = figures
            print(
                f"c={level} {name:8}{f['ttft_p50_ms']:>8.1f}ms{f['ttft_p99_ms']:>8.1f}ms{f['itl_ms']:>7.1f}ms{f['tokens']:>8}{f['tok_s']:>8.1f}"
            )
        print(
            f"c={level} ratio   TTFT p50 +{stack[level]['ttft_p50_ms'] - direct[level]['ttft_p50_ms']:.1f} ms, "
            f"throughput x{stack[level]['tok_s'] / direct[level]['tok_s']:.3f}"
        )
    # Added latency is one user's (c=1): at c=8 the engine's own queueing hides the stack's share.
    added_p50 = stack[1]["ttft_p50_ms"] - direct[1]["ttft_p50_ms"]
    added_p99 = stack[1]["ttft_p99_ms"] - direct[1]["ttft_p99_ms"]
    ratio = stack[8]["tok_s"] / direct[8]["tok_s"]
    print(f"RESULT ttft_added_p50_ms={added_p50:.1f} ttft_added_p99_ms={added_p99:.1f} throughput_ratio_c8={ratio:.3f}")


if __name__ == "__main__":
    main()
