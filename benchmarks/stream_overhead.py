"""What the serving stack adds to the engine's latency and throughput.

In one run, the same prompts at concurrency 1 and 8, with the same sampling (greedy, 64 tokens):
  (a) straight into a vLLM AsyncLLM in this process;
  (b) through the whole production stack: WebSocket → web process (uvicorn) → PostgreSQL → Celery
      (Redis broker) → GPU worker process → Redis channel layer → web process → WebSocket client.
Concurrency N means what it means in vLLM's own serving benchmark (`--max-concurrency`): N users,
each sending its next prompt as soon as its last answer has ended, so N requests are in flight at
all times (a closed loop). The run also times bursts: eight prompts sent at the same instant, the
next eight once the slowest of them has ended. That is a harsher shape (everything a message goes
through before the engine is paid by all eight at once, and the batch waits for its slowest), and
it is printed beside the closed loop, not used for the RESULT line.
Both engines are loaded for the whole run and the two sides take turns: at concurrency 1 prompt
by prompt, at concurrency 8 stretch by stretch (a closed loop over three passes of the prompts,
then three bursts), the side that goes first swapping every round. So a stretch in which the
machine runs slower or faster falls on both sides alike (on these machines the engine alone drifts
by 10-15 % within minutes, more than the overhead measured). Only one side works at a time, and
each stretch starts on a quiet machine: after a pause longer than the engine's busy-wait after a
step (`INFERENCE_CPU_WORKER_SPIN_MS`), so neither side finds the other's engine still spinning.

Prints TTFT p50/p99, inter-token latency, output tokens/s, their ratios, at c=1 how much later each
message's first text came through the stack than alone (sorted), the CPU each part of the
machine spent per output token at concurrency 8 (this process, each side's model process and
scheduler process, the web process, the worker process, Redis, PostgreSQL) and how long its
threads were ready to run but waited for a core (from the kernel's schedstat), how much dearer the
model process's token was through the stack than alone (and the ratio times that), how long each
user's place in the closed loop's batch stood empty while its next message crossed the stack, and a
final line
  RESULT ttft_added_p50_ms=<x> ttft_added_p99_ms=<y> throughput_ratio_c8=<z>
(added TTFT at concurrency 1, the throughput ratio at concurrency 8). --rounds sets the rounds.
Then, through the stack, it stops answers after their first text and prints how long each stop took
to end its answer (stop sent to `generation.done` received: the web process, the abort broadcast,
the worker cancelling the engine request and recording the end).

Needs PostgreSQL and Redis: `make benchmark` (or set DATABASE_URL and REDIS_URL and run
`python -m benchmarks overhead`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchmarks.harness import pct, result
from benchmarks.stack import (
    CONCURRENCY,
    MAX_TOKENS,
    PROMPTS,
    QUIET_MARGIN_S,
    One,
    Sample,
    Stopped,
    engine_direct,
    setup_django,
    tier_moderation,
    whole_stack,
)

# A c=8 stretch takes seconds and the engine's rate swings by 10-20 % from one to the next, so each
# round runs several prompts' worth (a c=1 pass over the prompts takes tens of seconds).
CLOSED_LOOP_PASSES = 3  # a closed-loop stretch answers the prompts this many times over
BURSTS_PER_ROUND = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "3")), help="rounds of both sides (3)"
    )
    parser.add_argument(
        "--moderation",
        choices=["on", "off"],
        default="on",
        help="the benchmark tier's moderation: on (the input and the output check, as shipped) or off",
    )


class CpuMeter:
    """CPU seconds spent by each part of the machine, summed over the timed stretches of each side
    and shape. On a machine whose cores the engine fills, whatever else runs takes its time from the
    engine, so this says where a throughput gap comes from."""

    def __init__(self, *, web_pid: int, worker_pid: int) -> None:
        import psutil

        self._psutil = psutil
        self.web = psutil.Process(web_pid)
        self.worker = psutil.Process(worker_pid)
        self.totals: dict[tuple[str, str], dict[str, float]] = {}
        self.waits: dict[tuple[str, str], dict[str, float]] = {}

    def _parts(self) -> dict[str, list]:
        me = self._psutil.Process()
        web = [self.web, *self.web.children(recursive=True)]
        workers_engine = self.worker.children(recursive=True)
        stack_pids = {p.pid for p in [*web, self.worker, *workers_engine]}
        named = {"redis": [], "postgres": []}
        for process in self._psutil.process_iter(["name"]):
            if process.info["name"] == "redis-server":
                named["redis"].append(process)
            elif process.info["name"] == "postgres":
                named["postgres"].append(process)
        alone_model, alone_rest = _model_process_apart(
            [p for p in me.children(recursive=True) if p.pid not in stack_pids]
        )
        workers_model, workers_rest = _model_process_apart(workers_engine)
        return {
            "benchmark process (client; front end of the engine alone)": [me],
            "engine alone: model process": alone_model,
            "engine alone: scheduler and the rest": alone_rest,
            "web process": web,
            "worker process": [self.worker],
            "worker's engine: model process": workers_model,
            "worker's engine: scheduler and the rest": workers_rest,
            **named,
        }

    def snapshot(self) -> dict[str, dict[int, tuple[float, float]]]:
        """Per part, per process: (CPU seconds, seconds its threads waited for a core)."""
        out: dict[str, dict[int, tuple[float, float]]] = {}
        for part, processes in self._parts().items():
            out[part] = {}
            for process in processes:
                try:
                    times = process.cpu_times()
                except self._psutil.Error:
                    continue
                out[part][process.pid] = (times.user + times.system, _run_queue_wait_s(process.pid))
        return out

    def add(self, key: tuple[str, str], before: dict, after: dict) -> None:
        totals = self.totals.setdefault(key, {})
        waits = self.waits.setdefault(key, {})
        for part, per_pid in after.items():
            earlier = before.get(part, {})
            spent = sum(cpu - earlier.get(pid, (0.0, 0.0))[0] for pid, (cpu, _) in per_pid.items())
            waited = sum(wait - earlier.get(pid, (0.0, 0.0))[1] for pid, (_, wait) in per_pid.items())
            totals[part] = totals.get(part, 0.0) + max(spent, 0.0)
            waits[part] = waits.get(part, 0.0) + max(waited, 0.0)


def _run_queue_wait_s(pid: int) -> float:
    """Seconds the process's live threads have spent runnable but waiting for a core (the second
    field of each thread's /proc schedstat; a thread that ends takes its count with it); 0 where the
    kernel does not keep it."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _model_process_apart(processes: list) -> tuple[list, list]:
    """An engine's processes split in two: vLLM's model process (the one that computes; its title
    is VLLM::Worker...), and its scheduler (VLLM::EngineCore) with the helpers. Each process's
    title is read once."""
    import psutil

    model, rest = [], []
    for process in processes:
        try:
            computes = "Worker" in " ".join(process.cmdline())
        except psutil.Error:
            computes = False
        (model if computes else rest).append(process)
    return model, rest


# Per shape ("c=1", "c=8", "burst"): each timed stretch's samples and its wall time.
Results = dict[str, list[tuple[list[Sample], float]]]


async def closed_loop(one: One, prompts: list[str], concurrency: int) -> tuple[list[Sample], float]:
    """`concurrency` users share the prompts, each sending its next one when its answer has ended."""
    waiting = list(prompts)
    samples: list[Sample] = []

    async def user() -> None:
        while waiting:
            samples.append(await one(waiting.pop(0)))

    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return samples, time.perf_counter() - started


async def run_paired(sides: dict[str, One], cpu: CpuMeter, rounds: int) -> dict[str, Results]:
    """Per side, the timed stretches of each shape, the sides taking turns request by request (c=1)
    and stretch by stretch (c=8 and bursts)."""
    from django.conf import settings

    quiet_s = settings.INFERENCE_CPU_WORKER_SPIN_MS / 1000 + QUIET_MARGIN_S
    results: dict[str, Results] = {name: {"c=1": [], "c=8": [], "burst": []} for name in sides}

    async def timed(shape: str, name: str, work: Callable[[], Awaitable[tuple[list[Sample], float]]]) -> None:
        await asyncio.sleep(quiet_s)
        before = cpu.snapshot()
        results[name][shape].append(await work())
        cpu.add((name, shape), before, cpu.snapshot())

    for round_ in range(rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for prompt in PROMPTS:
            for name in order:
                await timed("c=1", name, lambda one=sides[name], p=prompt: closed_loop(one, [p], 1))
        for name in order:
            await timed(
                "c=8", name, lambda one=sides[name]: closed_loop(one, PROMPTS * CLOSED_LOOP_PASSES, CONCURRENCY)
            )
        for _ in range(BURSTS_PER_ROUND):
            for name in order:
                # As many users as prompts: all sent at the same instant, the stretch ending with the slowest.
                await timed("burst", name, lambda one=sides[name]: closed_loop(one, PROMPTS, len(PROMPTS)))
    return results


# --- report --------------------------------------------------------------------------------------


def summarize(results: Results) -> dict[str, dict[str, float]]:
    out = {}
    for shape, stretches in results.items():
        samples = [s for stretch, _ in stretches for s in stretch]
        out[shape] = {
            "ttft_p50_ms": 1000 * pct([s.ttft for s in samples], 50),
            "ttft_p99_ms": 1000 * pct([s.ttft for s in samples], 99),
            "ttft_mean_ms": 1000 * statistics.mean(s.ttft for s in samples),
            "duration_mean_ms": 1000 * statistics.mean(s.duration for s in samples),
            "itl_ms": 1000 * statistics.mean(s.itl for s in samples),
            "tokens": sum(s.tokens for s in samples),
            "tok_s": sum(s.tokens for s in samples) / sum(wall for _, wall in stretches),
        }
    return out


def closed_loop_gap(direct: dict[str, float], stack: dict[str, float]) -> tuple[float, float]:
    """In the closed loop (one shape's summaries), how much later a message's first text came through
    the stack than alone (mean, ms), and that as a share of an answer's whole time through the stack.
    As far as that delay lies before the engine (the send, Celery, the claim), it is how long each
    user's place in the engine's batch stood empty while its next message crossed the stack, which the
    engine alone's next request does not: so it bounds what a message's way in costs the ratio. The
    answer's way out (its last words' output check and the end's transaction, before `done`) leaves
    the place empty too, and is not in it (docs/performance.md)."""
    added_ms = stack["ttft_mean_ms"] - direct["ttft_mean_ms"]
    return added_ms, added_ms / stack["duration_mean_ms"]


def added_by_message(direct: list[tuple[list[Sample], float]], stack: list[tuple[list[Sample], float]]) -> list[float]:
    """At c=1, how much later each message's first text came through the stack than the same prompt's
    alone in the same round (ms, sorted). The added TTFT p50 is a difference of two medians of a few
    dozen messages: a delay that only some messages meet moves it by the delay's whole size once it
    reaches half of them, and only this list shows whether that is what happened."""
    pairs = zip(
        (s for stretch, _ in direct for s in stretch), (s for stretch, _ in stack for s in stretch), strict=True
    )
    return sorted(1000 * (through.ttft - alone.ttft) for alone, through in pairs)


def rates(stretches: list[tuple[list[Sample], float]]) -> str:
    return " ".join(f"{sum(s.tokens for s in stretch) / wall:.0f}" for stretch, wall in stretches)


async def measure(deployment, rounds: int) -> tuple[dict[str, Results], CpuMeter, list[Stopped]]:
    from chatsite.heap import heap_freeze

    print("starting the stack (web process, Celery worker) and the engine alone ...", flush=True)
    async with whole_stack(deployment) as stack, engine_direct(deployment) as direct:
        heap_freeze()  # as the stack's processes do once warm, so neither side pauses for a full collection
        for one in (direct, stack.one):
            await one("Hello!")  # warm-up
        print("measuring, the two sides taking turns ...", flush=True)
        cpu = CpuMeter(web_pid=stack.web_pid, worker_pid=stack.worker_pid)
        results = await run_paired({"engine": direct, "stack": stack.one}, cpu, rounds)
        print("stopping answers after their first text ...", flush=True)
        stops = [await stack.stopped(prompt) for prompt in PROMPTS]
        return results, cpu, stops


def run(args: argparse.Namespace) -> None:
    deployment = setup_django()
    print(
        f"model {deployment.model_path}, greedy, max_tokens={MAX_TOKENS}, {len(PROMPTS)} prompts x {args.rounds} rounds",
        flush=True,
    )
    if niceness := os.nice(0):
        # Everything this run starts inherits it, PostgreSQL and Redis do not: not the usual arrangement.
        print(f"warning: running at nice {niceness}, and so will both engines, the web process and the worker")
    print(f"moderation of the benchmark's tier: {args.moderation}", flush=True)
    on = args.moderation == "on"
    with tier_moderation(moderate_input=on, moderate_output=on):
        results, cpu, stops = asyncio.run(measure(deployment, args.rounds))
    direct, stack = summarize(results["engine"]), summarize(results["stack"])
    print(f"\n{'':18}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL':>9}{'tokens':>8}{'tok/s':>8}")
    for shape in ("c=1", "c=8", "burst"):
        label = "c=8 burst" if shape == "burst" else shape
        for name, f in (("engine", direct[shape]), ("stack", stack[shape])):
            print(
                f"{label} {name:<{17 - len(label)}}{f['ttft_p50_ms']:>8.1f}ms{f['ttft_p99_ms']:>8.1f}ms"
                f"{f['itl_ms']:>7.1f}ms{f['tokens']:>8}{f['tok_s']:>8.1f}"
            )
        print(
            f"{label} ratio   TTFT p50 +{stack[shape]['ttft_p50_ms'] - direct[shape]['ttft_p50_ms']:.1f} ms, "
            f"throughput x{stack[shape]['tok_s'] / direct[shape]['tok_s']:.3f}"
        )
    print(
        "c=1 added TTFT message by message (ms, sorted): "
        + " ".join(f"{ms:.0f}" for ms in added_by_message(results["engine"]["c=1"], results["stack"]["c=1"]))
    )
    for shape in ("c=8", "burst"):
        print(
            f"{'c=8 burst' if shape == 'burst' else shape} tokens/s stretch by stretch: "
            + " | ".join(f"{name} {rates(results[name][shape])}" for name in results)
        )
    for shape in ("c=8", "burst"):
        label = "c=8 burst" if shape == "burst" else shape
        print(
            f"\n{label}: ms per output token by part of the machine, on a core (and waiting for one),"
            " and cores busy on average"
        )
        walls = {name: sum(wall for _, wall in results[name][shape]) for name in results}
        tokens = {name: sum(s.tokens for stretch, _ in results[name][shape] for s in stretch) for name in results}
        parts = cpu.totals[(next(iter(results)), shape)]
        print(f"{'':58}" + "".join(f"{name:>18}" for name in results))
        for part in parts:
            print(
                f"  {part:56}"
                + "".join(
                    f"{1000 * cpu.totals[(name, shape)][part] / tokens[name]:>10.2f}"
                    f" ({1000 * cpu.waits[(name, shape)][part] / tokens[name]:>4.2f})"
                    for name in results
                )
            )
        print(
            f"  {'all':56}"
            + "".join(
                f"{1000 * sum(cpu.totals[(name, shape)].values()) / tokens[name]:>10.2f}{'':8}" for name in results
            )
        )
        print(
            f"  {'cores busy':56}"
            + "".join(f"{sum(cpu.totals[(name, shape)].values()) / walls[name]:>10.2f}{'':8}" for name in results)
        )
        # Run by run, the throughput ratio follows how dear the model process's token is through the
        # stack against alone, which moves by several percent either way between runs; the ratio
        # times that quotient is what is left to the stack's own part (docs/performance.md).
        dearer = (cpu.totals[("stack", shape)]["worker's engine: model process"] / tokens["stack"]) / (
            cpu.totals[("engine", shape)]["engine alone: model process"] / tokens["engine"]
        )
        throughput = stack[shape]["tok_s"] / direct[shape]["tok_s"]
        print(
            f"  the model process's CPU a token, through the stack against alone: x{dearer:.3f};"
            f" the {label} ratio times that: {throughput * dearer:.3f}"
        )
        if shape == "c=8":
            added_ms, empty = closed_loop_gap(direct[shape], stack[shape])
            print(
                f"  the next message through the stack: its first text {added_ms:.1f} ms later (mean), each"
                f" user's place in the batch empty up to {100 * empty:.1f} % of the time"
            )
    stop_ms = [1000 * stop.seconds for stop in stops]
    print(
        f"stop to done: p50 {pct(stop_ms, 50):.0f} ms, max {max(stop_ms):.0f} ms; "
        f"{sum(stop.status == 'stopped' for stop in stops)}/{len(stops)} ended stopped, "
        f"after {' '.join(str(stop.tokens) for stop in stops)} of {MAX_TOKENS} tokens"
    )
    # Added latency is one user's (c=1): at c=8 the engine's own queueing hides the stack's share.
    added_p50 = stack["c=1"]["ttft_p50_ms"] - direct["c=1"]["ttft_p50_ms"]
    added_p99 = stack["c=1"]["ttft_p99_ms"] - direct["c=1"]["ttft_p99_ms"]
    ratio = stack["c=8"]["tok_s"] / direct["c=8"]["tok_s"]
    result(
        ttft_added_p50_ms=round(added_p50, 1),
        ttft_added_p99_ms=round(added_p99, 1),
        throughput_ratio_c8=round(ratio, 3),
    )
