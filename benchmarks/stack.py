"""The production topology's side of the stack benchmarks, shared by `overhead`, `trace` and `send`:
the benchmark's deployment and prompts, the engine alone in this process, and the whole stack (a web
process under uvicorn, a Celery worker, the local PostgreSQL and Redis) driven over its WebSocket as
the chat page drives it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import ROOT, django_setup

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
CONCURRENCY = 8
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


def setup_django():
    """Django on the production topology, migrated, with the benchmark's greedy deployment. No
    titles (see `start`): here nothing would end their generations, which fill the queue."""
    os.environ["CHAT_TITLES_FROM_MODEL"] = "false"
    django_setup()
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


# The policy `tier_moderation` puts on the benchmarks' tier while they run.
BENCHMARK_POLICY = "benchmark-moderation-switch"


@contextmanager
def tier_moderation(
    *, moderate_input: bool = True, moderate_output: bool = True, tier_name: str = "enterprise"
) -> Iterator[None]:
    """While the block runs, the benchmark users' tier is moderated as asked. Both checks on is as
    configured, and changes nothing; otherwise a policy of the benchmark's own with the checks asked
    for is the tier's only active one, and the tier's own active policies are put back afterwards."""
    from accounts.models import Tier
    from moderation.models import ModerationPolicy
    from moderation.selectors import policy_cache_invalidate

    if moderate_input and moderate_output:
        yield
        return
    tier = Tier.objects.get(name=tier_name)
    own = ModerationPolicy.objects.filter(tier=tier, is_active=True).exclude(name=BENCHMARK_POLICY)
    paused = list(own.values_list("id", flat=True))
    ModerationPolicy.objects.filter(id__in=paused).update(is_active=False)
    ModerationPolicy.objects.update_or_create(
        name=BENCHMARK_POLICY,
        defaults={
            "tier": tier,
            "is_active": True,
            "moderate_input": moderate_input,
            "moderate_output": moderate_output,
        },
    )
    policy_cache_invalidate()
    try:
        yield
    finally:
        ModerationPolicy.objects.filter(name=BENCHMARK_POLICY).update(is_active=False)
        ModerationPolicy.objects.filter(id__in=paused).update(is_active=True)
        policy_cache_invalidate()


def prompt_ids(deployment, prompt: str) -> list[int]:
    from inference.engine.tokenizers import render_chat, tokenizer_for

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
    web_pid: int
    worker_pid: int


@asynccontextmanager
async def engine_direct(deployment) -> AsyncIterator[One]:
    from inference.engine.host import EngineHost
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


# --- (b) the whole stack -------------------------------------------------------------------------


def _send_frame(prompt: str) -> dict:
    """A new conversation's first message, as the chat page sends it (with its own client_id)."""
    return {"type": "message.send", "model": DEPLOYMENT, "content": prompt, "client_id": str(uuid.uuid4())}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    # Every message here is a new conversation's first, whose answer the service follows with a
    # generation of the conversation's title: it would share the engine with the benchmark's next
    # message, sent a second later, where a person reads the answer first. What is measured is the
    # message's own way through the stack, so the stack's processes write no titles.
    env = {**os.environ, "CHAT_TITLES_FROM_MODEL": "false"}
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, env=env
    )


@asynccontextmanager
async def whole_stack(deployment) -> AsyncIterator[Stack]:
    import websockets
    from django.contrib.auth import get_user_model
    from django.test import Client

    from accounts.models import Tier
    from accounts.services import user_set_tier
    from inference.execution.workers import worker_command, worker_engine_state

    logs = Path(os.environ.get("CHATSITE_DATA_DIR", ROOT / "var"))
    port = free_port()
    node = f"bench@{socket.gethostname()}"
    worker = start(
        worker_command(queues=[f"gpu.{DEPLOYMENT}"], node=node, concurrency=16, loglevel="WARNING"),
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
            "--ws-per-message-deflate",
            "false",
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
        for _ in range(CONCURRENCY):
            ws = await connections.enter_async_context(websockets.connect(url, additional_headers=headers))
            await ws.recv()  # engine.status greeting
            sockets.put_nowait(ws)

        async def one(prompt: str) -> Sample:
            ws = await sockets.get()
            try:
                started = time.perf_counter()
                await ws.send(json.dumps(_send_frame(prompt)))
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
                await ws.send(json.dumps(_send_frame(prompt)))
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

        yield Stack(one, stopped, web.pid, worker.pid)
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
