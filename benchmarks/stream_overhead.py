"""What the serving stack adds to the engine's latency and throughput.

In one run, the same prompts at concurrency 1 and 8, with the same sampling (greedy, 64 tokens):
  (a) straight into a vLLM AsyncLLM in this process;
  (b) through the whole production stack: WebSocket → web process (uvicorn) → PostgreSQL → Celery
      (Redis broker) → GPU worker process → Redis channel layer → web process → WebSocket client.
Both engines are loaded for the whole run and the two sides take turns: at concurrency 1 prompt
by prompt, at concurrency 8 batch by batch (three batches a round), the side that goes first
swapping every round. So a stretch in which the machine runs slower or faster falls on both sides
alike (on these machines the engine alone drifts by 10-15 % within minutes, more than the overhead
measured). Only one side works at a time, and each request starts on a quiet machine: after a
pause longer than the engine's busy-wait after a step (`INFERENCE_CPU_WORKER_SPIN_MS`), so neither
side's request finds the other's engine still spinning.

Prints TTFT p50/p99, inter-token latency, output tokens/s, their ratios, and a final line
  RESULT ttft_added_p50_ms=<x> ttft_added_p99_ms=<y> throughput_ratio_c8=<z>
(added TTFT at concurrency 1, the throughput ratio at concurrency 8). BENCH_ROUNDS sets the rounds.
Then, through the stack, it stops answers after their first text and prints how long each stop took
to end its answer (stop sent to `generation.done` received: the web process, the abort broadcast,
the worker cancelling the engine request and recording the end).

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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
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
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
# A c=8 batch takes a few seconds and its rate swings by 10-20 % from one to the next, so each round
# runs several (a c=1 pass over the prompts takes tens of seconds).
BATCHES_PER_ROUND = 3
# Before each request, beyond the engine's busy-wait after a step (INFERENCE_CPU_WORKER_SPIN_MS).
QUIET_MARGIN_S = 0.15


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


One = Callable[[str], Awaitable[Sample]]


@dataclass
class Stopped:
    seconds: float  # from the stop sent to its `generation.done` received
    status: str
    tokens: int


@dataclass
class Stack:
    one: One
    stopped: Callable[[str], Awaitable[Stopped]]  # a message stopped after its first text


@asynccontextmanager
async def engine_direct(deployment) -> AsyncIterator[One]:
    from inference.engine import EngineHost
    from inference.selectors import engine_spec_for

    host = EngineHost(engine_spec_for(deployment))
    host.start()
    await host.wait_ready(timeout=900)
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

    try:
        yield one
    finally:
        await host.aclose()


Results = dict[int, list[tuple[Sample, float]]]


async def run_paired(sides: dict[str, One]) -> dict[str, Results]:
    """Per side and concurrency level, the samples and the wall time of each batch, the sides
    taking turns request by request (c=1) and batch by batch (c=8)."""
    from django.conf import settings

    quiet_s = settings.INFERENCE_CPU_WORKER_SPIN_MS / 1000 + QUIET_MARGIN_S
    results: dict[str, Results] = {name: {1: [], 8: []} for name in sides}
    for round_ in range(ROUNDS):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for prompt in PROMPTS:
            for name in order:
                await asyncio.sleep(quiet_s)
                started = time.perf_counter()
                sample = await sides[name](prompt)
                results[name][1].append((sample, time.perf_counter() - started))
        for _ in range(BATCHES_PER_ROUND):
            for name in order:
                await asyncio.sleep(quiet_s)
                started = time.perf_counter()
                samples = await asyncio.gather(*(sides[name](p) for p in PROMPTS))
                wall = time.perf_counter() - started
                results[name][8].extend((s, wall) for s in samples)
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


@asynccontextmanager
async def whole_stack(deployment) -> AsyncIterator[Stack]:
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
    connections = AsyncExitStack()
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
        headers = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}
        for _ in range(100):
            try:
                async with websockets.connect(url, additional_headers=headers):
                    break
            except OSError:
                await asyncio.sleep(0.2)
        # One socket per user, opened before anything is timed and kept for all of that user's
        # messages, as the chat page keeps one for as long as it is open: the handshake is a page
        # load's cost, not a message's. Eight users, so that eight messages can be in flight.
        sockets: asyncio.Queue = asyncio.Queue()
        for _ in range(len(PROMPTS)):
            ws = await connections.enter_async_context(websockets.connect(url, additional_headers=headers))
            await ws.recv()  # engine.status greeting
            sockets.put_nowait(ws)

        async def one(prompt: str) -> Sample:
            ws = await sockets.get()
            try:
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
            finally:
                sockets.put_nowait(ws)

        async def stopped(prompt: str) -> Stopped:
            ws = await sockets.get()
            try:
                await ws.send(json.dumps({"type": "message.send", "model": DEPLOYMENT, "content": prompt}))
                stop_sent = None
                while True:
                    event = json.loads(await ws.recv())
                    if event["type"] == "generation.delta" and stop_sent is None:
                        stop_sent = time.perf_counter()
                        await ws.send(json.dumps({"type": "generation.stop", "generation": event["generation"]}))
                    elif event["type"] == "generation.done":
                        seconds = time.perf_counter() - (stop_sent or time.perf_counter())
                        return Stopped(seconds, event["status"], event["usage"]["completion_tokens"])
                    elif event["type"] in ("generation.error", "error"):
                        raise RuntimeError(event)
            finally:
                sockets.put_nowait(ws)

        yield Stack(one, stopped)
    finally:
        await connections.aclose()
        for process in (web, worker):
            os.killpg(process.pid, signal.SIGTERM)
        for process in (web, worker):
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


# --- report --------------------------------------------------------------------------------------


def batches(rows: list[tuple[Sample, float]]) -> list[tuple[int, float]]:
    """The c=8 rows, batch by batch: the tokens of each batch and its wall time."""
    size = len(PROMPTS)
    return [(sum(s.tokens for s, _ in rows[i : i + size]), rows[i][1]) for i in range(0, len(rows), size)]


def summarize(results: Results) -> dict[int, dict[str, float]]:
    out = {}
    for level, rows in results.items():
        samples = [s for s, _ in rows]
        if level == 1:
            throughput = sum(s.tokens for s in samples) / sum(w for _, w in rows)
        else:
            throughput = sum(s.tokens for s in samples) / sum(wall for _, wall in batches(rows))
        out[level] = {
            "ttft_p50_ms": 1000 * pct([s.ttft for s in samples], 50),
            "ttft_p99_ms": 1000 * pct([s.ttft for s in samples], 99),
            "itl_ms": 1000 * statistics.mean(s.itl for s in samples),
            "tokens": sum(s.tokens for s in samples),
            "tok_s": throughput,
        }
    return out


async def measure(deployment) -> tuple[dict[str, Results], list[Stopped]]:
    from chatsite.heap import heap_freeze

    print("starting the stack (web process, Celery worker) and the engine alone ...", flush=True)
    async with whole_stack(deployment) as stack, engine_direct(deployment) as direct:
        heap_freeze()  # as the stack's processes do once warm, so neither side pauses for a full collection
        for one in (direct, stack.one):
            await one("Hello!")  # warm-up
        print("measuring, the two sides taking turns ...", flush=True)
        results = await run_paired({"engine": direct, "stack": stack.one})
        print("stopping answers after their first text ...", flush=True)
        stops = [await stack.stopped(prompt) for prompt in PROMPTS]
        return results, stops


def main() -> None:
    deployment = setup_django()
    print(
        f"model {deployment.model_path}, greedy, max_tokens={MAX_TOKENS}, {len(PROMPTS)} prompts x {ROUNDS} rounds",
        flush=True,
    )
    results, stops = asyncio.run(measure(deployment))
    direct, stack = summarize(results["engine"]), summarize(results["stack"])
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
    print(
        "c=8 tokens/s round by round: "
        + " | ".join(
            f"{name} " + " ".join(f"{tokens / wall:.0f}" for tokens, wall in batches(results[name][8]))
            for name in results
        )
    )
    stop_ms = [1000 * stop.seconds for stop in stops]
    print(
        f"stop to done: p50 {pct(stop_ms, 50):.0f} ms, max {max(stop_ms):.0f} ms; "
        f"{sum(stop.status == 'stopped' for stop in stops)}/{len(stops)} ended stopped, "
        f"after {' '.join(str(stop.tokens) for stop in stops)} of {MAX_TOKENS} tokens"
    )
    # Added latency is one user's (c=1): at c=8 the engine's own queueing hides the stack's share.
    added_p50 = stack[1]["ttft_p50_ms"] - direct[1]["ttft_p50_ms"]
    added_p99 = stack[1]["ttft_p99_ms"] - direct[1]["ttft_p99_ms"]
    ratio = stack[8]["tok_s"] / direct[8]["tok_s"]
    print(f"RESULT ttft_added_p50_ms={added_p50:.1f} ttft_added_p99_ms={added_p99:.1f} throughput_ratio_c8={ratio:.3f}")


if __name__ == "__main__":
    main()
