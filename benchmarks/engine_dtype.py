"""What the engine's dtype costs on this CPU: the default model in bfloat16 against float32.

For each dtype, one engine with the default deployment's arguments, in a process of its own:
  - ms a step while decoding, at batch 1 and batch 8 (64 tokens each, greedy, to the end);
  - the first token of a new prompt of about 20, 70 and 280 tokens (each prompt new, so no
    cached prefix: the time to compute the prompt, as a new message pays it).
Then which dtype the deployment's `auto` picks here, and one line
  RESULT native_bf16=<yes|no> auto=<dtype> step_b8_ms_bf16=<x> step_b8_ms_f32=<y> first_token_70_ms_bf16=<a> ...

Run with `make benchmark-dtype` (or `python -m benchmarks dtype`), with nothing else using the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from benchmarks.harness import ROOT, django_setup, result

DTYPES = ("bfloat16", "float32")
SHORT = {"bfloat16": "bf16", "float32": "f32"}
STEPS = 64
PROMPT_SIZES = (1, 4, 16)  # repetitions of a sentence of about 17 tokens
SENTENCE = "Explain, step by step and with examples, how the water cycle works in nature. "


def measure(dtype: str) -> dict[str, float]:
    """Start an engine in `dtype` in this process and time it."""
    django_setup()
    from vllm import LLM, SamplingParams

    from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME
    from inference.engine.host import engine_environment_set
    from inference.models import ModelDeployment
    from inference.selectors import engine_spec_for

    spec = engine_spec_for(ModelDeployment(name=DEFAULT_DEPLOYMENT_NAME, **DEFAULT_DEPLOYMENT_FIELDS))
    engine_environment_set()
    llm = LLM(**{**spec.engine_args(), "dtype": dtype})
    decode = SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True)
    llm.generate(["Warm up."], decode, use_tqdm=False)
    figures: dict[str, float] = {}
    for batch in (1, 8):
        prompts = [f"Tell me about the history of city number {i}." for i in range(batch)]
        started = time.perf_counter()
        llm.generate(prompts, decode, use_tqdm=False)
        figures[f"step_b{batch}_ms"] = (time.perf_counter() - started) / STEPS * 1000
    first = SamplingParams(max_tokens=1, temperature=0)
    tokenizer = llm.get_tokenizer()
    for size in PROMPT_SIZES:
        timings, tokens = [], 0
        for attempt in range(3):
            prompt = f"Question {size}-{attempt}. " + SENTENCE * size
            tokens = len(tokenizer.encode(prompt))
            started = time.perf_counter()
            llm.generate([prompt], first, use_tqdm=False)
            timings.append((time.perf_counter() - started) * 1000)
        figures[f"first_token_{tokens}_ms"] = statistics.median(timings)
    return figures


def figures_of_child(dtype: str) -> dict[str, float]:
    """Run `measure(dtype)` in a process group of its own, ended as soon as it has printed its figures
    (an offline vLLM engine can hang at interpreter exit, its processes asleep)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "dtype", "--one", dtype],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        for line in child.stdout:
            if line.startswith("FIGURES "):
                return json.loads(line.removeprefix("FIGURES "))
        sys.exit(f"the {dtype} engine failed (exit status {child.wait()}); run with --one {dtype} to see why")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--one", choices=DTYPES, help=argparse.SUPPRESS)  # the child's run


def run(args: argparse.Namespace) -> None:
    if args.one:
        print("FIGURES " + json.dumps(measure(args.one)), flush=True)
        return

    from chatsite.cpu import cpu_has_native_bf16
    from inference.engine.host import engine_dtype

    native = cpu_has_native_bf16()
    results: dict[str, dict[str, float]] = {}
    for dtype in DTYPES:
        print(f"starting an engine in {dtype} ...", flush=True)
        results[dtype] = figures_of_child(dtype)

    print(f"\nnative bfloat16 on this CPU: {'yes' if native else 'no'}")
    print(f"{'':28}" + "".join(f"{dtype:>12}" for dtype in DTYPES) + "   bf16 / f32")
    for key in results[DTYPES[0]]:
        values = [results[dtype][key] for dtype in DTYPES]
        label = key.replace("_ms", "").replace("_", " ")
        print(f"{label:28}" + "".join(f"{v:10.1f}ms" for v in values) + f"   x{values[0] / values[1]:.2f}")
    auto = engine_dtype("auto", on_cpu=True, native_bf16=native)
    print(f"a deployment's auto computes in {auto} here")
    fields = {f"{key}_{SHORT[dtype]}": round(results[dtype][key], 1) for key in results[DTYPES[0]] for dtype in DTYPES}
    result(native_bf16="yes" if native else "no", auto=auto, **fields)
