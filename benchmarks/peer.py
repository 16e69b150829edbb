"""The service beside vLLM's own OpenAI server, measured by vLLM's own serving benchmark.

Starts two servers on the default deployment's model: this service (the embedded default, under
uvicorn, with a data directory of its own: a fresh SQLite database, a user on the enterprise plan
and an API key) and `vllm serve` with the engine settings the service gives vLLM (dtype, eager mode,
context length, prefix caching, `VLLM_CPU_KVCACHE_SPACE`). Then it runs `vllm bench serve --backend
openai-chat` (random prompts, the same seed, `--ignore-eos` so every answer has the same length) at
each concurrency against each server, taking turns, the side that goes first swapping every round,
with the same sampling on both: the deployment's defaults (temperature, top_p, repetition penalty),
sent explicitly. vLLM's CLI runs through `benchmarks/vllm_cli.py`, which works where vLLM is
installed as `vllm-cpu`.

Prints each run's output tokens/s, time to first token (vLLM's TTFT: the first chunk with a choice,
which both servers send with the first text) and time per output token, then per concurrency the
ratio of output tokens/s (service / vLLM) and how much later the service's first text came (median
TTFT, service - vLLM), and a final line
  RESULT ratio_c1=<x> ttft_added_c1_ms=<y> ratio_c8=<z> ttft_added_c8_ms=<w>
(for the concurrencies asked). Input moderation, plans, quotas and the ledger are the service's
own work and are measured with it; the service's CPU spin settings (docs/performance.md) are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from benchmarks.harness import ROOT, django_setup, result

MODEL_NAME = "smollm2-135m"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", default="1,8", help="comma-separated concurrencies (default 1,8)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per run; at least twice the concurrency")
    parser.add_argument("--rounds", type=int, default=1, help="runs per side and concurrency (default 1)")
    parser.add_argument("--input-len", type=int, default=128, help="random prompt length in tokens (default 128)")
    parser.add_argument("--output-len", type=int, default=64, help="answer length in tokens (default 64)")


def run(args: argparse.Namespace) -> None:
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    data_dir = Path(tempfile.mkdtemp(prefix="peer-bench-"))
    env = _service_environment(data_dir)
    os.environ.update(env)
    for name in ("DATABASE_URL", "REDIS_URL"):  # the embedded default
        os.environ.pop(name, None)
    deployment, key = _service_setup()
    sampling = ["--temperature", str(deployment.temperature), "--top-p", str(deployment.top_p)]
    sampling += ["--repetition-penalty", str(deployment.repetition_penalty)]
    service_port, vllm_port = _free_port(), _free_port()
    with ExitStack() as running:
        running.callback(_stop, _start(_service_command(service_port), data_dir / "service.log", os.environ))
        running.callback(_stop, _start(_vllm_serve_command(deployment, vllm_port), data_dir / "vllm.log", os.environ))
        sides = {
            "service": (f"http://127.0.0.1:{service_port}", key),
            "vllm": (f"http://127.0.0.1:{vllm_port}", "none"),
        }
        _wait_ready(f"http://127.0.0.1:{vllm_port}/health", data_dir / "vllm.log")
        _wait_ready(f"http://127.0.0.1:{service_port}/readyz", data_dir / "service.log")
        figures: dict[tuple[str, int], list[dict]] = {}
        print(f"{'c':>3} {'side':<8} {'out tok/s':>10} {'TTFT p50 ms':>12} {'TTFT mean ms':>13} {'TPOT p50 ms':>12}")
        for concurrency in concurrencies:
            for round_ in range(args.rounds):
                order = ["service", "vllm"] if round_ % 2 == 0 else ["vllm", "service"]
                for side in order:
                    base_url, api_key = sides[side]
                    figure = _bench(
                        base_url,
                        api_key,
                        deployment=deployment,
                        concurrency=concurrency,
                        prompts=max(args.prompts, 2 * concurrency),
                        args=args,
                        sampling=sampling,
                        out=data_dir / f"{side}-c{concurrency}-r{round_}.json",
                    )
                    figures.setdefault((side, concurrency), []).append(figure)
                    print(
                        f"{concurrency:>3} {side:<8} {figure['output_throughput']:>10.1f} "
                        f"{figure['median_ttft_ms']:>12.0f} {figure['mean_ttft_ms']:>13.0f} "
                        f"{figure['median_tpot_ms']:>12.1f}",
                        flush=True,
                    )
    summary: dict[str, float] = {}
    print(f"\n{'c':>3} {'tok/s service/vLLM':>19} {'TTFT p50 added ms':>18}")
    for concurrency in concurrencies:
        service, vllm = figures[("service", concurrency)], figures[("vllm", concurrency)]
        ratio = _mean(service, "output_throughput") / _mean(vllm, "output_throughput")
        added = _mean(service, "median_ttft_ms") - _mean(vllm, "median_ttft_ms")
        print(f"{concurrency:>3} {ratio:>19.3f} {added:>18.0f}")
        summary[f"ratio_c{concurrency}"] = round(ratio, 3)
        summary[f"ttft_added_c{concurrency}_ms"] = round(added, 1)
    print(f"(logs and vLLM's result files in {data_dir})")
    result(**summary)


def _mean(runs: list[dict], key: str) -> float:
    return sum(run[key] for run in runs) / len(runs)


def _service_environment(data_dir: Path) -> dict[str, str]:
    """A data directory of the benchmark's own, with the models of the checkout's."""
    models = os.environ.get("INFERENCE_MODELS_DIR") or str(
        Path(os.environ.get("CHATSITE_DATA_DIR", ROOT / "var")) / "models"
    )
    return {
        "CHATSITE_DATA_DIR": str(data_dir),
        "INFERENCE_MODELS_DIR": models,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }


def _service_setup():
    """Migrate the benchmark's database; the default deployment and an enterprise user's API key."""
    django_setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from accounts.models import Tier
    from accounts.services import api_key_create, user_set_tier
    from inference.models import ModelDeployment

    deployment = ModelDeployment.objects.get(name=settings.INFERENCE_DEFAULT_DEPLOYMENT)
    user, _ = get_user_model().objects.get_or_create(username="peer-benchmark")
    user_set_tier(user=user, tier=Tier.objects.get(name="enterprise"))
    return deployment, api_key_create(user=user, name="peer benchmark", scopes=["chat"]).key


def _service_command(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "chatsite.asgi:application", "--port", str(port), "--lifespan", "on"]


def _vllm_serve_command(deployment, port: int) -> list[str]:
    """`vllm serve` with the engine arguments the service gives vLLM (`EngineSpec.engine_args`)."""
    from chatsite.cpu import cpu_has_native_bf16
    from inference.engine.host import engine_dtype
    from inference.selectors import engine_spec_for

    args = engine_spec_for(deployment).engine_args()
    command = [sys.executable, "-m", "benchmarks.vllm_cli", "serve", args.pop("model"), "--port", str(port)]
    command += ["--served-model-name", args.pop("served_model_name")]
    command += ["--dtype", engine_dtype(args.pop("dtype"), on_cpu=True, native_bf16=cpu_has_native_bf16())]
    args.pop("worker_extension_cls")  # the service's own hooks (its spin settings)
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is not False:
            command += [flag, str(value)]
    return command


def _bench(base_url, api_key, *, deployment, concurrency, prompts, args, sampling, out: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "benchmarks.vllm_cli",
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        base_url,
        "--model",
        MODEL_NAME,
        "--tokenizer",
        deployment.model_path,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(concurrency),
        "--ignore-eos",
        "--seed",
        "0",
        "--disable-tqdm",
        *sampling,
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]
    env = {**os.environ, "OPENAI_API_KEY": api_key}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if finished.returncode != 0 or not out.exists():
        sys.exit(f"vllm bench serve failed against {base_url}:\n{finished.stdout[-3000:]}\n{finished.stderr[-3000:]}")
    figures = json.loads(out.read_text())
    if figures.get("completed") != prompts:
        sys.exit(
            f"only {figures.get('completed')} of {prompts} requests to {base_url} succeeded: {figures.get('errors')}"
        )
    return figures


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(command: list[str], log: Path, env) -> subprocess.Popen:
    return subprocess.Popen(
        command, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, env=dict(env)
    )


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


def _wait_ready(url: str, log: Path, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    sys.exit(f"{url} did not become ready; see {log}")
