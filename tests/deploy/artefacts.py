"""What the deployment tests read: the repository's artefacts, the service's own URL paths, metric
names and settings, to hold the chart, the compose file and the image to the service they start."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from django.urls import Resolver404, resolve
from prometheus_client.metrics_core import Metric

from observability import metrics
from observability.views import healthz, metrics_view, readyz

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "chatsite"
PROBES = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics_view}
APPS = ["chatsite", "accounts", "moderation", "inference", "billing", "orchestration", "documents", "conversations"]
APPS += ["observability"]
# A name in a PromQL query: a series of the service's or vLLM's own.
METRIC_NAME = re.compile(r"\b(chatsite_[a-z0-9_]+|vllm:[a-z0-9_:]+)")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}


def view_at(path: str):
    """The view the service serves `path` with (a 404 fails the caller's assert with its path)."""
    try:
        return resolve(path).func
    except Resolver404:
        return None


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line.strip() and not line.startswith("#"))


def service_series() -> set[str]:
    """Every series name the service's /metrics can carry: its families with their suffixes."""
    families: list[Metric] = list(metrics.registry().collect())
    names = set()
    for family in families:
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def vllm_source(module: str) -> str:
    """A vLLM module's text, read without importing vLLM (which takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vLLM is not installed"
    return Path(spec.submodule_search_locations[0], *module.split(".")).with_suffix(".py").read_text()


def vllm_series() -> set[str]:
    """The series vLLM's Prometheus stat logger defines (a counter's with `_total`)."""
    source = vllm_source("v1.metrics.loggers")
    names = set(re.findall(r'name="(vllm:[a-z0-9_:]+)"', source))
    return (
        names
        | {name + "_total" for name in names}
        | {name + suffix for name in names for suffix in SUFFIXES["histogram"]}
    )


def metric_names(text: str) -> set[str]:
    return set(METRIC_NAME.findall(text))


def settings_read() -> str:
    """The text of every module of the service and the Procfile: where a setting's name must appear."""
    texts = [(ROOT / "Procfile").read_text()]
    for app in APPS:
        texts += [path.read_text() for path in sorted((ROOT / app).rglob("*.py")) if "migrations" not in path.parts]
    return "\n".join(texts)


def vllm_settings() -> str:
    return vllm_source("envs")


def setting_is_read(name: str, service: str, vllm: str) -> bool:
    if name.startswith("VLLM_"):
        return f'"{name}"' in vllm
    return f'"{name}"' in service or f"${{{name}:-" in service or f"${{{name}}}" in service
