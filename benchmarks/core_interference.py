"""What work on the other core costs the engine's model process on a CPU host.

On a CPU host vLLM binds its model process to one core (core 0 on two cores) and leaves the others
to its scheduler, the web process, the Celery worker, PostgreSQL and Redis. This probe stands in for
the model process: bound to core 0, it times a bfloat16 step of 8 rows through 256 MB of weights
(memory-bound, like a decoding step; the median of 80 steps) while one kind of load runs in a
process bound to core 1:

  - Python spinning (does the other core share execution units, as a sibling hyper-thread would?);
  - streaming 64 MB from memory (memory traffic);
  - the moderation embedder scoring texts back to back (the web process's and the worker's
    heaviest work);
  - PostgreSQL commits as fast as they go, the backend bound to core 1 too (with `--database`).

The machine's own speed drifts by several percent within a minute under KVM, so each load's step
is compared with the idle steps timed just before and just after it (their mean), and the run ends
with one line
  RESULT idle_ms=<x> spin=<a> memory=<b> embedder=<c> postgres_commits=<d>
(medians over the rounds, in per cent). Run with `make benchmark-interference` (or `python -m
benchmarks interference [--database URL] [--rounds N]`), with nothing else using the CPU. Linux
only, at least two cores. docs/performance.md has the figures measured so far.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from benchmarks.harness import ROOT, result

STEPS = 80
SETTLE_S = 1.0

# Each load runs in a process of its own, bound to core 1: its set-up, then a line saying it is
# ready, then its loop. DATABASE_URL is filled in where used.
BIND = "import os; os.sched_setaffinity(0, {1})\n"
READY = "print('ready', flush=True)\n"
LOADS = {
    "spin": BIND + READY + "while True: pass\n",
    "memory": BIND
    + "import numpy as np\nsource = np.ones(8_000_000); target = np.empty_like(source)\n"
    + READY
    + "while True: np.copyto(target, source)\n",
    "embedder": BIND
    + "import django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'chatsite.settings'); django.setup()\n"
    + "from moderation import classifiers\nclassifiers.warm_up()\n"
    + "texts = ['The capital of France is Paris, a city known for its art and its history.'] * 4\n"
    + READY
    + "while True: classifiers.score_many(texts)\n",
    "postgres_commits": BIND
    + "import psycopg\nconnection = psycopg.connect(DATABASE_URL, autocommit=True)\n"
    + "os.sched_setaffinity(connection.execute('select pg_backend_pid()').fetchone()[0], {1})\n"
    + "connection.execute('create temporary table probe (id serial primary key, v text)')\n"
    + READY
    + "while True:\n    with connection.transaction():\n"
    + "        connection.execute(\"insert into probe (v) values ('x')\")\n",
}
LABELS = {
    "spin": "Python spinning",
    "memory": "streaming 64 MB from memory",
    "embedder": "the moderation embedder, back to back",
    "postgres_commits": "PostgreSQL commits, the backend bound to core 1",
}


def step_timer():
    import torch

    torch.set_num_threads(1)
    weights = [torch.randn(4096, 4096, dtype=torch.bfloat16) for _ in range(8)]
    rows = torch.randn(8, 4096, dtype=torch.bfloat16)

    def step() -> None:
        out = rows
        for weight in weights:
            out = (out @ weight).clamp_(-1, 1)

    for _ in range(5):
        step()

    def median_step_ms() -> float:
        times = []
        for _ in range(STEPS):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000

    return median_step_ms


def start_load(name: str, database: str | None) -> subprocess.Popen:
    code = LOADS[name].replace("DATABASE_URL", repr(database))
    load = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if load.stdout.readline().strip() != "ready":
        load.kill()
        raise SystemExit(f"the {name} load did not start")
    time.sleep(SETTLE_S)
    return load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database", help="a PostgreSQL URL for the commits load (left out without one)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the loads (3)")


def run(args: argparse.Namespace) -> None:
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs Linux and at least two cores")
    os.sched_setaffinity(0, {0})
    median_step_ms = step_timer()
    loads = ["spin", "memory", "embedder"] + (["postgres_commits"] if args.database else [])
    results: dict[str, list[float]] = {name: [] for name in loads}
    idle_steps = [median_step_ms()]
    for round_number in range(1, args.rounds + 1):
        for name in loads:
            load = start_load(name, args.database)
            try:
                ms = median_step_ms()
            finally:
                load.kill()
                load.wait()
            before, after = idle_steps[-1], median_step_ms()
            idle_steps.append(after)
            against = ms / ((before + after) / 2) - 1
            results[name].append(against * 100)
            print(
                f"round {round_number}: {LABELS[name]:50s} {ms:7.2f} ms a step, idle {before:.2f} and {after:.2f}"
                f" ({against:+.1%})",
                flush=True,
            )
    summary = {name: round(statistics.median(results[name]), 1) for name in loads}
    result(idle_ms=round(statistics.median(idle_steps), 2), **summary)
