"""How many live answer streams one web process carries.

N chat sockets, each sending a message and following its answer to the end, then the next (a
closed loop), while the engine is replaced by a token source that writes --rate tokens a second
(benchmarks/token_source.py: its first token says it is not a model). The point is the web tier's
cost: the socket, the consumer, the channel layer, the runner where it runs in the web process.
Moderation is off for the benchmark's tier (its cost is `benchmark-moderation`'s), as are its limits.

N starts at --start and grows by --factor each stage until the delivery lag's p99 (a token made →
its text received by the client) passes --lag-ms, or the web process uses --cpu-limit of a core;
each stage is measured over --stage-s after its sockets are all streaming. Printed per stage: N, lag
p50/p99, the web process's CPU (share of one core) and its CPU per stream, the client's own CPU
(it shares the machine), then `RESULT` with the N reached per layer.

Layers: `memory` is the embedded default (SQLite, in-memory channel layer, the runner in the web
process, in a temporary data folder); `redis` is the production topology (DATABASE_URL's PostgreSQL,
REDIS_URL's Redis, the runner in a Celery worker: the web process only follows). `both` runs each
in a process of its own.

    python -m benchmarks capacity --layer both
    DATABASE_URL=postgres://… REDIS_URL=redis://…/N python -m benchmarks capacity --layer redis
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.harness import ROOT, pct, result
from benchmarks.token_source import TICKS_MODULO, TICKS_PER_S, ticks_now

DEPLOYMENT = "capacity-token-source"
TICK = re.compile(r"t(\d+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layer", choices=["memory", "redis", "both"], default="both")
    parser.add_argument("--rate", type=float, default=25, help="tokens a second per answer (default 25)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per answer (default 100)")
    parser.add_argument("--start", type=int, default=10, help="streams in the first stage (default 10)")
    parser.add_argument("--factor", type=float, default=1.6, help="growth of N per stage (default 1.6)")
    parser.add_argument("--max-streams", type=int, default=600)
    parser.add_argument("--stage-s", type=float, default=8, help="seconds measured per stage (default 8)")
    parser.add_argument("--lag-ms", type=float, default=100, help="the p99 delivery lag that ends the run")
    parser.add_argument("--cpu-limit", type=float, default=0.9, help="the web process's share of a core that ends it")


def run(args: argparse.Namespace) -> None:
    if os.environ.get("CAPACITY_LAYER") == args.layer:  # in the layer's own process, environment set
        asyncio.run(_measure(args))
        return
    reached = {}
    for layer in ("memory", "redis") if args.layer == "both" else (args.layer,):
        if layer == "redis" and not (os.environ.get("REDIS_URL") and os.environ.get("DATABASE_URL")):
            print("redis: set DATABASE_URL and REDIS_URL to measure the production topology; skipped")
            continue
        line = _run_layer_process(layer, args)
        reached.update({k: v for k, v in line.items() if k != "benchmark"})
    result(**reached)


def _run_layer_process(layer: str, args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", "benchmarks", "capacity", "--json", "--layer", layer]
    for name in ("rate", "tokens", "start", "factor", "max_streams", "stage_s", "lag_ms", "cpu_limit"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = _layer_environment(layer)
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    last = {}
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{"):
            last = json.loads(line)
        else:
            print(line, end="", flush=True)
    process.wait()
    return last


def _layer_environment(layer: str) -> dict[str, str]:
    env = {
        **os.environ,
        "INFERENCE_DEFAULT_DEPLOYMENT": DEPLOYMENT,
        "INFERENCE_MODELS_DIR": str(ROOT / "var" / "models"),
        "CHAT_TITLES_FROM_MODEL": "false",
        "CHATSITE_LOCAL_SECRET": "1",
        "CAPACITY_LAYER": layer,
    }
    if layer == "memory":
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        env["CHATSITE_DATA_DIR"] = tempfile.mkdtemp(prefix="capacity-")
    return env


def _prepare(args: argparse.Namespace) -> dict[str, list[int]]:
    """The benchmark's deployment, the only one enabled (readiness asks an engine of every enabled
    one), its tier without limits or moderation, migrated first. Returns what it turned off."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from accounts.models import Tier
    from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
    from inference.models import ModelDeployment
    from moderation.models import ModerationPolicy
    from moderation.selectors import policy_cache_invalidate

    ModelDeployment.objects.update_or_create(
        name=DEPLOYMENT,
        defaults={**DEFAULT_DEPLOYMENT_FIELDS, "default_max_tokens": args.tokens, "max_queued": 100_000},
    )
    others = list(ModelDeployment.objects.filter(is_enabled=True).exclude(name=DEPLOYMENT).values_list("id", flat=True))
    ModelDeployment.objects.filter(id__in=others).update(is_enabled=False)
    enterprise = Tier.objects.get(name="enterprise")
    unlimited = {
        field.name: None
        for field in Tier._meta.get_fields()
        if field.name.endswith(("_per_minute", "_per_hour", "_per_day", "_per_month")) and getattr(field, "null", False)
    }
    Tier.objects.filter(id=enterprise.id).update(**unlimited)
    policies = list(
        ModerationPolicy.objects.filter(tier=enterprise, is_active=True)
        .exclude(name="capacity-benchmark")
        .values_list("id", flat=True)
    )
    ModerationPolicy.objects.filter(id__in=policies).update(is_active=False)
    ModerationPolicy.objects.update_or_create(
        name="capacity-benchmark",
        defaults={"tier": enterprise, "is_active": True, "moderate_input": False, "moderate_output": False},
    )
    policy_cache_invalidate()
    return {"deployments": others, "policies": policies}


def _restore(disabled: dict[str, list[int]]) -> None:
    from inference.models import ModelDeployment
    from moderation.models import ModerationPolicy
    from moderation.selectors import policy_cache_invalidate

    ModerationPolicy.objects.filter(name="capacity-benchmark").update(is_active=False)
    ModerationPolicy.objects.filter(id__in=disabled["policies"]).update(is_active=True)
    ModelDeployment.objects.filter(id__in=disabled["deployments"]).update(is_enabled=True)
    policy_cache_invalidate()


def _sessions(count: int) -> list[str]:
    """`count` users of the benchmark's tier, each signed in: their session cookies."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from accounts.models import Tier

    users = get_user_model()
    enterprise = Tier.objects.get(name="enterprise")
    cookies = []
    for i in range(count):
        user, _ = users.objects.get_or_create(username=f"capacity-{i}", defaults={"tier": enterprise})
        if user.tier_id != enterprise.id:
            users.objects.filter(id=user.id).update(tier=enterprise)
        client = Client()
        client.force_login(user)
        cookies.append(f"sessionid={client.cookies['sessionid'].value}")
    return cookies


def _start(layer: str, port: int, workers: int, logs: Path) -> list[subprocess.Popen]:
    def spawn(argv: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.token_source", *argv],
            cwd=ROOT,
            stdout=(logs / log).open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    processes = [spawn(["web", "--port", str(port)], "capacity-web.log")]
    if layer == "redis":
        processes.append(
            spawn(["worker", "--queue", f"gpu.{DEPLOYMENT}", "--concurrency", str(workers)], "capacity-worker.log")
        )
    return processes


class Stream:
    """One user's socket: a message, its answer followed to the end, the next message."""

    def __init__(self, url: str, cookie: str, origin: str) -> None:
        self.url, self.cookie, self.origin = url, cookie, origin
        self.lags_ms: list[tuple[float, float]] = []  # (when received, lag)
        self.streaming = asyncio.Event()
        self.errors = 0

    async def run(self, stop: asyncio.Event) -> None:
        import websockets

        headers = {"Cookie": self.cookie, "Origin": self.origin}
        async with websockets.connect(self.url, additional_headers=headers, max_queue=None) as ws:
            await ws.recv()  # engine.status
            while not stop.is_set():
                await ws.send(
                    json.dumps(
                        {
                            "type": "message.send",
                            "model": DEPLOYMENT,
                            "content": "Stream please.",
                            "client_id": str(uuid.uuid4()),
                        }
                    )
                )
                while True:
                    event = json.loads(await ws.recv())
                    kind = event["type"]
                    if kind == "generation.delta":
                        now, received = ticks_now(), time.monotonic()
                        for made in TICK.findall(event.get("text", "")):
                            lag = ((now - int(made)) % TICKS_MODULO) / TICKS_PER_S * 1000
                            self.lags_ms.append((received, lag))
                        self.streaming.set()
                    elif kind == "generation.done":
                        break
                    elif kind in ("generation.error", "error"):
                        self.errors += 1
                        await asyncio.sleep(1)
                        break


async def _measure(args: argparse.Namespace) -> None:
    import psutil

    from benchmarks.harness import django_setup
    from benchmarks.stack import free_port

    django_setup()
    from django.conf import settings

    layer = "redis" if settings.REDIS_URL else "memory"
    disabled = await asyncio.to_thread(_prepare, args)
    cookies = await asyncio.to_thread(_sessions, args.max_streams)
    port = free_port()
    logs = Path(settings.DATA_DIR)
    processes = _start(layer, port, args.max_streams + 8, logs)
    web = psutil.Process(processes[0].pid)
    me = psutil.Process()
    stop = asyncio.Event()
    tasks: list[asyncio.Task] = []
    streams: list[Stream] = []
    reached, stages = 0, []
    try:
        code = await asyncio.to_thread(
            subprocess.call,
            [
                sys.executable,
                str(ROOT / "scripts" / "wait_ready.py"),
                f"http://127.0.0.1:{port}/readyz",
                "--timeout",
                "600",
            ],
        )
        if code != 0:
            sys.exit(f"the service did not become ready; see {logs}/capacity-*.log")
        print(f"== {layer}: {args.rate:g} tokens/s per answer, {args.tokens} tokens each ==", flush=True)
        print(
            f"{'N':>5} {'lag p50':>8} {'lag p99':>8} {'web CPU':>8} {'per stream':>10} {'client CPU':>10} {'errors':>6}"
        )
        n = args.start
        while n <= args.max_streams:
            while len(streams) < n:
                stream = Stream(f"ws://127.0.0.1:{port}/ws/chat/", cookies[len(streams)], f"http://127.0.0.1:{port}")
                streams.append(stream)
                tasks.append(asyncio.create_task(stream.run(stop)))
            await asyncio.wait_for(asyncio.gather(*(s.streaming.wait() for s in streams)), timeout=120)
            await asyncio.sleep(1)  # past the burst of the new streams' first messages
            began, web_cpu, my_cpu = time.monotonic(), _cpu(web), _cpu(me)
            await asyncio.sleep(args.stage_s)
            ended = time.monotonic()
            web_share = (_cpu(web) - web_cpu) / (ended - began)
            my_share = (_cpu(me) - my_cpu) / (ended - began)
            lags = [lag for s in streams for when, lag in s.lags_ms if began <= when <= ended]
            errors = sum(s.errors for s in streams)
            if not lags:
                sys.exit("no token arrived during the stage")
            p50, p99 = pct(lags, 50), pct(lags, 99)
            stages.append({"n": n, "p50": p50, "p99": p99, "cpu": web_share})
            print(
                f"{n:>5} {p50:>6.1f}ms {p99:>6.1f}ms {web_share:>8.0%} {web_share / n:>10.2%} {my_share:>10.0%} {errors:>6}",
                flush=True,
            )
            if p99 > args.lag_ms or web_share >= args.cpu_limit:
                why = f"lag p99 {p99:.0f} ms > {args.lag_ms:g}" if p99 > args.lag_ms else f"web CPU {web_share:.0%}"
                print(f"stopped at N={n}: {why}", flush=True)
                break
            reached = n
            n = max(n + 1, round(n * args.factor))
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        await asyncio.to_thread(_restore, disabled)
    per_stream = [s["cpu"] / s["n"] for s in stages if s["n"] <= max(reached, stages[0]["n"])]
    result(
        **{
            f"{layer}_streams": reached,
            f"{layer}_cpu_per_stream_pct": round(100 * min(per_stream), 2) if per_stream else 0,
        }
    )


def _cpu(process) -> float:
    times = process.cpu_times()
    return times.user + times.system
