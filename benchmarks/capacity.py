"""How many live answer streams one web process carries, and what each process spends a token.

N users, each sending a message and following its answer to the end, then the next (a closed
loop), while the engine is replaced by a token source that writes --rate tokens a second
(benchmarks/token_source.py: its first token says it is not a model). The point is the web tier's
cost: the socket or event stream, the consumer, the channel layer, the runner where it runs in the
web process. Moderation is off for the benchmark's tier (input moderation's cost is
`benchmark-moderation`'s; --moderate-output scores the answers), as are its limits. The clients run
in --client-processes processes of their own (`benchmarks/capacity_clients.py`), over --protocol:
the chat socket (`ws`), `/v1/chat/completions`' server-sent events (`sse`) or the conversations
API's (`conversations`).

N starts at --start and grows by --factor each stage until the delivery lag's p99 (a token made →
its text received by the client) passes --lag-ms, or a web process uses --cpu-limit of a core; or
--streams names the stages (`1,100,500`), each measured whatever the one before it showed. Each
stage is measured over --stage-s after its streams are all under way. Printed per stage: N, lag
p50/p90/p99, the busiest web process's share of a core, the web processes' and the worker's CPU
per token received (ms), the tokens received a second; then `RESULT` per layer.

Layers: `memory` is the embedded default (SQLite, in-memory channel layer, the runner in the web
process, in a temporary data folder); `redis` is the production topology (DATABASE_URL's PostgreSQL,
REDIS_URL's Redis, the runner in a Celery worker: --web-processes web processes only follow, each
stream on one of them in turn). `both` runs each in a process of its own.

    python -m benchmarks capacity --layer both
    DATABASE_URL=postgres://… REDIS_URL=redis://…/N python -m benchmarks capacity --layer redis \
        --streams 1,100,500 --protocol sse --web-processes 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from benchmarks.harness import ROOT, pct, result
from benchmarks.stack import tier_moderation

DEPLOYMENT = "capacity-token-source"


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
    parser.add_argument("--streams", default="", help="measure exactly these N, comma-separated (e.g. 1,100,500)")
    parser.add_argument("--protocol", choices=["ws", "sse", "conversations"], default="ws", help="the way out")
    parser.add_argument("--web-processes", type=int, default=1, help="web processes behind the streams (redis)")
    parser.add_argument("--client-processes", type=int, default=2, help="processes running the clients")
    parser.add_argument(
        "--moderate-output", action="store_true", help="score the answers as they stream (output moderation's cost)"
    )


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
    names = ("rate", "tokens", "start", "factor", "max_streams", "stage_s", "lag_ms", "cpu_limit", "protocol")
    for name in (*names, "web_processes", "client_processes"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.streams:
        argv += ["--streams", args.streams]
    if args.moderate_output:
        argv.append("--moderate-output")
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


def _prepare(args: argparse.Namespace) -> tuple[list[int], ExitStack]:
    """The benchmark's deployment, the only one enabled (readiness asks an engine of every enabled
    one), its tier without limits or moderation, migrated first. Returns the deployments it turned
    off, and the moderation it set, to be put back (`_restore`)."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from accounts.models import Tier
    from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
    from inference.models import ModelDeployment

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
    moderation = ExitStack()
    moderation.enter_context(
        tier_moderation(moderate_input=False, moderate_output=args.moderate_output, tier_name=enterprise.name)
    )
    return others, moderation


def _restore(others: list[int], moderation: ExitStack) -> None:
    from inference.models import ModelDeployment

    moderation.close()
    ModelDeployment.objects.filter(id__in=others).update(is_enabled=True)


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


def _start(layer: str, ports: list[int], workers: int, logs: Path) -> list[subprocess.Popen]:
    """The web processes, one a port, then (on Redis) the worker."""

    def spawn(argv: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.token_source", *argv],
            cwd=ROOT,
            stdout=(logs / log).open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    processes = [spawn(["web", "--port", str(port)], f"capacity-web-{i}.log") for i, port in enumerate(ports)]
    if layer == "redis":
        processes.append(
            spawn(["worker", "--queue", f"gpu.{DEPLOYMENT}", "--concurrency", str(workers)], "capacity-worker.log")
        )
    return processes


def _credentials(protocol: str, count: int) -> list[str]:
    """`count` users of the benchmark's tier: a session cookie each for the socket, an API key each for
    the event streams (made anew each run: a key is shown only once)."""
    if protocol == "ws":
        return _sessions(count)
    from django.contrib.auth import get_user_model

    from accounts.models import ApiKey, Tier
    from accounts.services import api_key_create

    users = get_user_model()
    enterprise = Tier.objects.get(name="enterprise")
    keys = []
    for i in range(count):
        user, _ = users.objects.get_or_create(username=f"capacity-{i}", defaults={"tier": enterprise})
        if user.tier_id != enterprise.id:
            users.objects.filter(id=user.id).update(tier=enterprise)
        ApiKey.objects.filter(user=user, name="capacity").delete()
        scopes = [ApiKey.Scope.CHAT, ApiKey.Scope.CONVERSATIONS_WRITE]
        keys.append(api_key_create(user=user, name="capacity", scopes=scopes).key)
    return keys


def _stages(args: argparse.Namespace) -> list[int]:
    if args.streams:
        return [int(n) for n in args.streams.split(",")]
    stages, n = [], args.start
    while n <= args.max_streams:
        stages.append(n)
        n = max(n + 1, round(n * args.factor))
    return stages


async def _measure(args: argparse.Namespace) -> None:
    import multiprocessing

    import psutil

    from benchmarks.capacity_clients import Target, client_process
    from benchmarks.harness import django_setup
    from benchmarks.stack import free_port

    django_setup()
    from django.conf import settings

    layer = "redis" if settings.REDIS_URL else "memory"
    webs = args.web_processes if layer == "redis" else 1
    stages = _stages(args)
    others, moderation = await asyncio.to_thread(_prepare, args)
    credentials = await asyncio.to_thread(_credentials, args.protocol, max(stages))
    ports = [free_port() for _ in range(webs)]
    logs = Path(settings.DATA_DIR)
    processes = _start(layer, ports, max(stages) + 8, logs)
    web = [psutil.Process(p.pid) for p in processes[:webs]]
    worker = psutil.Process(processes[webs].pid) if layer == "redis" else None
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    # Stream i goes to web process i mod W, and is run by client process i mod K.
    targets = [Target(bases[i % webs], credential) for i, credential in enumerate(credentials)]
    spawn = multiprocessing.get_context("spawn")
    clients = []
    reached, results = 0, []
    try:
        for port in ports:
            code = await asyncio.to_thread(
                subprocess.call,
                [sys.executable, str(ROOT / "scripts" / "wait_ready.py"), f"http://127.0.0.1:{port}/readyz", "--timeout", "600"],
            )  # fmt: skip
            if code != 0:
                sys.exit(f"the service did not become ready; see {logs}/capacity-*.log")
        for k in range(args.client_processes):
            parent, child = spawn.Pipe()
            mine = targets[k :: args.client_processes]
            process = spawn.Process(target=client_process, args=(child, mine, args.protocol, DEPLOYMENT), daemon=True)
            process.start()
            clients.append((process, parent))
        print(
            f"== {layer}, {args.protocol}: {args.rate:g} tokens/s per answer, {args.tokens} tokens each, "
            f"{webs} web process(es), {args.client_processes} client process(es) ==",
            flush=True,
        )
        print(
            f"{'N':>5} {'lag p50':>8} {'p90':>7} {'p99':>7} {'web CPU':>8} {'web ms/tok':>10} {'worker':>7} "
            f"{'wkr ms/tok':>10} {'tokens/s':>8} {'errors':>6}"
        )
        for n in stages:
            for k, (_, conn) in enumerate(clients):
                conn.send(("grow", len(range(k, n, args.client_processes))))
            for _, conn in clients:
                await asyncio.to_thread(conn.recv)
            await asyncio.sleep(2)  # past the burst of the new streams' first messages
            began = time.monotonic()
            web_cpu, worker_cpu = [_cpu(w) for w in web], _cpu(worker) if worker else 0.0
            await asyncio.sleep(args.stage_s)
            ended = time.monotonic()
            web_used = [_cpu(w) - c for w, c in zip(web, web_cpu, strict=True)]
            worker_used = (_cpu(worker) - worker_cpu) if worker else 0.0
            lags: list[float] = []
            errors = 0
            for _, conn in clients:
                conn.send(("report", began, ended))
            for _, conn in clients:
                _, got, errs = await asyncio.to_thread(conn.recv)
                lags += got
                errors += errs
            if not lags:
                sys.exit("no token arrived during the stage")
            seconds, tokens = ended - began, len(lags)
            p50, p90, p99 = pct(lags, 50), pct(lags, 90), pct(lags, 99)
            web_share = max(web_used) / seconds  # the busiest web process's share of a core
            web_ms = 1000 * sum(web_used) / tokens
            worker_ms = 1000 * worker_used / tokens
            stage = {"n": n, "p50": round(p50, 1), "p90": round(p90, 1), "p99": round(p99, 1)}
            stage |= {"web_cpu": round(web_share, 3), "web_ms_per_token": round(web_ms, 4)}
            stage |= {"worker_cpu": round(worker_used / seconds, 3), "worker_ms_per_token": round(worker_ms, 4)}
            stage |= {"tokens_per_s": round(tokens / seconds, 1), "errors": errors}
            results.append(stage)
            print(
                f"{n:>5} {p50:>6.1f}ms {p90:>5.1f}ms {p99:>5.1f}ms {web_share:>8.0%} {web_ms:>10.3f} "
                f"{worker_used / seconds:>7.0%} {worker_ms:>10.3f} {tokens / seconds:>8.0f} {errors:>6}",
                flush=True,
            )
            if not args.streams and (p99 > args.lag_ms or web_share >= args.cpu_limit):
                why = f"lag p99 {p99:.0f} ms > {args.lag_ms:g}" if p99 > args.lag_ms else f"web CPU {web_share:.0%}"
                print(f"stopped at N={n}: {why}", flush=True)
                break
            if p99 <= args.lag_ms and web_share < args.cpu_limit:
                reached = n
    finally:
        for _, conn in clients:
            conn.send(("stop",))
        for process, _ in clients:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        await asyncio.to_thread(_restore, others, moderation)
    within = [s for s in results if s["n"] <= max(reached, results[0]["n"] if results else 0)]
    result(
        **{
            f"{layer}_streams": reached,
            f"{layer}_web_ms_per_token": min((s["web_ms_per_token"] for s in within), default=0),
            f"{layer}_worker_ms_per_token": min((s["worker_ms_per_token"] for s in within), default=0),
            f"{layer}_stages": json.dumps(results, separators=(",", ":")),
        }
    )


def _cpu(process) -> float:
    times = process.cpu_times()
    return times.user + times.system
