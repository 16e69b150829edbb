"""Where the time the stack adds to a first text goes, message by message, at concurrency 1.

`make benchmark` gives the added TTFT as a difference of two medians; from one message to the next
the same prompt's first text comes 5-60 ms later through the stack than alone (docs/performance.md).
This run says which step of the way that spread lies in. It sends the benchmark's prompts one at a
time, the stack and the engine alone taking turns prompt by prompt as in `make benchmark`, and
watches the Redis server with MONITOR, which stamps every command with the server's clock as it runs
it. Each message's way through the stack is cut at the commands it leaves there:

- admission: the web process charges the rate limits (`EVALSHA` on an `rl:` key), inside the send's
  transaction, after the socket frame, the session, the conversation's row and the prompt;
- dispatch: the Celery task is pushed onto the deployment's queue (`LPUSH gpu.<deployment>`), after
  the rest of the transaction and its commit;
- received: the worker's Celery consumer takes the task (`ZADD unacked_index`, kombu noting an
  unacknowledged delivery);
- first text: the worker publishes the answer's first text (`RPUSH chatsite:stream:<id>` of its
  first `generation.delta`), after the engine's first token, the claim and the message's verdict;
- the client: the first text arrives on the WebSocket (the web process relays the channel layer).

The engine's own share of "received → first text" is the same prompt's first text alone in the same
round; what is left is the worker's (Celery's thread, the runner, the claim, the verdict, the first
publish). Printed: each message's parts, and for each part its median, its spread (10th to 90th
percentile) and how closely it follows the message's whole added time (Pearson's r over the
messages); the engine alone's spread per prompt; and whether the message's verdict (`PUBLISH
chatsite:release`) came later than the engine alone would have had its first token. MONITOR costs
Redis a little per command, so the stack is a little slower than in `make benchmark`: compare the
parts with each other, not with that run's RESULT.

Ends with the medians: the added time and each part's. Needs PostgreSQL and Redis: `make
benchmark-trace` (`python -m benchmarks trace --rounds N`, 5 rounds by default).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

from benchmarks.harness import pct, result
from benchmarks.stack import DEPLOYMENT, PROMPTS, QUIET_MARGIN_S, engine_direct, setup_django, whole_stack


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rounds", type=int, default=int(os.environ.get("TRACE_ROUNDS", "5")), help="rounds over the prompts (5)"
    )


# The commands that mark a message's way, as MONITOR shows them (upper-cased), in the order taken.
MARKS = {
    "admission": lambda c: c.startswith("EVALSHA") and " RL:" in c,
    "dispatch": lambda c: c.startswith(f"LPUSH GPU.{DEPLOYMENT.upper()}"),
    "received": lambda c: c.startswith("ZADD UNACKED_INDEX"),
    "release": lambda c: c.startswith("PUBLISH CHATSITE:RELEASE"),
    "first text": lambda c: c.startswith("RPUSH CHATSITE:STREAM:") and "GENERATION.DELTA" in c,
}
# The parts of a message's added time, each between two marks (the client's send and first text at
# the ends); "worker" is less the engine alone's first text.
PARTS = [
    ("send -> admission (web: frame, session, transaction's start)", "send", "admission"),
    ("admission -> dispatch (transaction's rest, commit, Celery)", "admission", "dispatch"),
    ("dispatch -> received (Celery, to the worker)", "dispatch", "received"),
    ("received -> first text, less the engine alone (worker)", "received", "first text"),
    ("first text -> client (channel layer, web, socket)", "first text", "client"),
]


class RedisMonitor:
    """Every command the Redis server runs, with the server's time: the mark it is, if it is one."""

    def __init__(self, url: str) -> None:
        import redis

        # No read timeout: the server may run nothing worth a line for a while.
        self._client = redis.Redis.from_url(url, socket_timeout=None)
        self._entries: list[tuple[float, str]] = []  # (the server's time, the mark's name)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="redis-monitor", daemon=True)
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._monitor = None

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            sys.exit("could not start MONITOR on Redis")

    def stop(self) -> None:
        """End the watch: its connection is closed, which ends the thread's read."""
        self._stopping.set()
        if self._monitor is not None:
            self._monitor.connection.disconnect()
        self._thread.join(timeout=5)

    def _read(self) -> None:
        try:
            with self._client.monitor() as monitor:
                self._monitor = monitor
                self._ready.set()
                for entry in monitor.listen():
                    command = entry["command"][:4096].upper()
                    name = next((name for name, test in MARKS.items() if test(command)), None)
                    if name is not None:
                        with self._lock:
                            self._entries.append((entry["time"], name))
        except Exception:
            if not self._stopping.is_set():
                raise

    def marks(self, since: float, until: float) -> dict[str, float]:
        """The first time each mark was seen between `since` and `until` (Unix seconds)."""
        with self._lock:
            entries = [(t, name) for t, name in self._entries if since <= t <= until]
        found: dict[str, float] = {}
        for t, name in entries:
            found.setdefault(name, t)
        return found


@dataclass
class Traced:
    prompt: str
    alone_ttft: float  # seconds
    added: float  # seconds: through the stack less alone
    parts: dict[str, float] = field(default_factory=dict)  # seconds, by part
    # Seconds the message's verdict (its release) came after the engine alone would have had the first
    # token ready (the task received, plus the alone's first text): above 0, the verdict held it.
    release_late: float | None = None


async def trace(deployment, rounds: int) -> list[Traced]:
    from django.conf import settings

    from chatsite.heap import heap_freeze

    monitor = RedisMonitor(settings.REDIS_URL)
    quiet_s = settings.INFERENCE_CPU_WORKER_SPIN_MS / 1000 + QUIET_MARGIN_S
    print("starting the stack (web process, Celery worker) and the engine alone ...", flush=True)
    async with whole_stack(deployment) as stack, engine_direct(deployment) as direct:
        heap_freeze()
        for one in (direct, stack.one):
            await one("Hello!")  # warm-up
        monitor.start()
        print(f"tracing {len(PROMPTS)} prompts x {rounds} rounds, the two sides taking turns ...", flush=True)
        traced: list[Traced] = []
        try:
            for round_ in range(rounds):
                for prompt in PROMPTS:
                    alone = through = None
                    for side in ("engine", "stack") if round_ % 2 == 0 else ("stack", "engine"):
                        await asyncio.sleep(quiet_s)
                        if side == "engine":
                            alone = await direct(prompt)
                            continue
                        sent = time.time()
                        through = await stack.one(prompt)
                        await asyncio.sleep(0.05)  # the monitor's thread reads the last commands
                        marks = monitor.marks(sent, sent + through.duration)
                        marks["send"], marks["client"] = sent, sent + through.ttft
                    traced.append(_traced(prompt, alone.ttft, through.ttft, marks))
        finally:
            monitor.stop()
        return traced


def _traced(prompt: str, alone_ttft: float, through_ttft: float, marks: dict[str, float]) -> Traced:
    out = Traced(prompt, alone_ttft, through_ttft - alone_ttft)
    if "admission" not in marks and "send" in marks:
        # A plan without rate limits (the benchmark's) charges none: part 1 is then 0, part 2 the
        # whole way from the send to the dispatch.
        marks = {**marks, "admission": marks["send"]}
    for name, start, end in PARTS:
        if start in marks and end in marks:
            out.parts[name] = marks[end] - marks[start] - (alone_ttft if start == "received" else 0.0)
    if "release" in marks and "received" in marks:
        out.release_late = marks["release"] - (marks["received"] + alone_ttft)
    return out


def report(traced: list[Traced]) -> None:
    names = [name for name, _, _ in PARTS]
    complete = [t for t in traced if len(t.parts) == len(PARTS)]
    print(f"\n{len(complete)} of {len(traced)} messages with every mark; ms, in the order sent:")
    print(f"{'added':>7}{'alone':>7}" + "".join(f"{i + 1:>7}" for i in range(len(PARTS))) + "   prompt")
    for t in traced:
        cells = "".join(f"{1000 * t.parts[n]:>7.1f}" if n in t.parts else f"{'-':>7}" for n in names)
        print(f"{1000 * t.added:>7.1f}{1000 * t.alone_ttft:>7.1f}{cells}   {t.prompt[:40]}")
    if len(complete) < 3:
        print("too few complete messages to summarise")
        return
    added = [1000 * t.added for t in complete]
    print(f"\n{'part':66}{'p50':>7}{'p10':>7}{'p90':>7}{'r':>7}")
    print(f"  {'the added time, whole':64}{pct(added, 50):>7.1f}{pct(added, 10):>7.1f}{pct(added, 90):>7.1f}")
    for i, name in enumerate(names):
        values = [1000 * t.parts[name] for t in complete]
        r = statistics.correlation(values, added) if len(set(values)) > 1 else 0.0
        label = f"{i + 1} {name}"
        print(f"  {label:64}{pct(values, 50):>7.1f}{pct(values, 10):>7.1f}{pct(values, 90):>7.1f}{r:>7.2f}")
    by_prompt: dict[str, list[float]] = {}
    for t in traced:
        by_prompt.setdefault(t.prompt, []).append(1000 * t.alone_ttft)
    spreads = [max(v) - min(v) for v in by_prompt.values()]
    print(
        f"the engine alone, the same prompt from round to round: first text {min(min(v) for v in by_prompt.values()):.1f}"
        f"-{max(max(v) for v in by_prompt.values()):.1f} ms, spread per prompt p50 {statistics.median(spreads):.1f} ms,"
        f" max {max(spreads):.1f}"
    )
    late = [1000 * t.release_late for t in traced if t.release_late is not None]
    held = sorted(ms for ms in late if ms > 0)
    print(
        f"the message's verdict: released after the commit in {len(late)} of {len(traced)} messages (the rest"
        f" were judged inside the transaction); before the engine alone's first text would have been ready in"
        f" {len(late) - len(held)}"
        + (f", after it in {len(held)}, by {' '.join(f'{ms:.1f}' for ms in held)} ms" if held else "")
    )


def run(args: argparse.Namespace) -> None:
    deployment = setup_django()
    traced = asyncio.run(trace(deployment, args.rounds))
    report(traced)
    complete = [t for t in traced if len(t.parts) == len(PARTS)]
    if complete:
        medians = {
            f"part{i + 1}_p50_ms": round(1000 * statistics.median(t.parts[name] for t in complete), 1)
            for i, (name, _, _) in enumerate(PARTS)
        }
        result(
            messages=len(traced),
            added_p50_ms=round(1000 * statistics.median(t.added for t in complete), 1),
            **medians,
        )
