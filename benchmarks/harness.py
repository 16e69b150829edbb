"""What every benchmark shares: the repository on the path, Django's settings, a percentile, and one
way to print a run's figures.

Each benchmark is a module with a docstring (its help), `add_arguments(parser)` and `run(args)`;
`python -m benchmarks <name>` (benchmarks/__main__.py) parses the arguments and runs it. A run
prints what it measured as it goes, in tables for a person, and ends with one `result(...)`: a line
`RESULT key=value ...`, or with `--json` one JSON object, for a script to collect.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

# Sub-command -> module under benchmarks/. Its Makefile target is `benchmark-<name>` (`benchmark` for overhead).
BENCHMARKS = {
    "overhead": "stream_overhead",
    "send": "send_latency",
    "trace": "first_text_trace",
    "scale": "send_reads_at_scale",
    "embedded": "embedded_first_text",
    "moderation": "moderation_latency",
    "moderation_quality": "moderation_quality",
    "cuts": "answer_cuts",
    "dtype": "engine_dtype",
    "interference": "core_interference",
    "capacity": "capacity",
    "peer": "peer",
    "retrieval": "retrieval",
    "semantic_cache": "semantic_cache",
    "injection": "injection",
}

_output = {"name": "", "json": False}


def django_setup() -> None:
    """Set Django up with the environment's settings (the embedded default when nothing is set)."""
    import django

    django.setup()


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def result(**figures: float | int | str) -> None:
    """Print the run's figures: `RESULT key=value ...`, or one JSON object with --json."""
    if _output["json"]:
        print(json.dumps({"benchmark": _output["name"], **figures}), flush=True)
    else:
        print("RESULT " + " ".join(f"{key}={value}" for key, value in figures.items()), flush=True)


def benchmark_module(name: str) -> ModuleType:
    import importlib

    return importlib.import_module(f"benchmarks.{BENCHMARKS[name]}")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m benchmarks", description="On-demand measurements of the service (docs/performance.md)."
    )
    commands = top.add_subparsers(dest="benchmark", required=True, metavar="<benchmark>")
    for name in BENCHMARKS:
        module = benchmark_module(name)
        doc = (module.__doc__ or "").strip()
        command = commands.add_parser(
            name,
            help=doc.split("\n\n")[0].replace("\n", " "),
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_argument(
            "--json", action="store_true", help="print the result as one JSON object, not a RESULT line"
        )
        if hasattr(module, "add_arguments"):
            module.add_arguments(command)
    return top


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    _output.update(name=args.benchmark, json=args.json)
    benchmark_module(args.benchmark).run(args)
