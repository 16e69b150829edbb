"""compose.yaml, the production topology on one host: valid against the Compose Specification's
schema, with and without its variables filled from .env.example, and holding what the topology needs
(a health check on every service, the migration first, Redis persistent, workers on cores of their
own, NVIDIA devices in the gpu profile), its checks and settings ones the service has."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml
from django.conf import settings

from tests.deploy.artefacts import PROBES, ROOT, procfile, setting_is_read, settings_read, view_at, vllm_settings

COMPOSE = ROOT / "compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
APP_SERVICES = {"web", "worker", "worker-2", "worker-gpu", "documents"}
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}; $$ is a literal $.
VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
# What Compose casts from a string once variables are filled in.
INTEGERS = {("deploy", "replicas"), ("count",)}


def compose_spec_schema() -> dict[str, Any]:
    """The Compose Specification's JSON schema, as check-jsonschema vendors it."""
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(vendored.read_text())


def env_example() -> dict[str, str]:
    lines = ENV_EXAMPLE.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def interpolate(text: str, env: dict[str, str]) -> str:
    def fill(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, operator, argument = match.groups()
        value = env.get(name)
        if operator in {":?", "?"} and (value is None or (operator == ":?" and not value)):
            raise AssertionError(f"{name} is required: {argument}")
        if operator in {":-", "-"} and (value is None or (operator == ":-" and not value)):
            return argument
        return value or ""

    return VARIABLE.sub(fill, text)


def filled(node: Any, env: dict[str, str], path: tuple[str, ...] = ()) -> Any:
    """The parsed file with its variables filled in, as Compose does: in each string value, after
    parsing, then the few fields it casts to integers."""
    if isinstance(node, dict):
        return {key: filled(value, env, (*path, key)[-2:]) for key, value in node.items()}
    if isinstance(node, list):
        return [filled(item, env, path) for item in node]
    if isinstance(node, str):
        value = interpolate(node, env)
        return int(value) if (path in INTEGERS or path[-1:] in INTEGERS) and value.isdigit() else value
    return node


def load(**env: str) -> dict[str, Any]:
    return filled(yaml.safe_load(COMPOSE.read_text()), {**env_example(), **env})


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load()


def test_the_file_matches_the_compose_specification():
    schema = compose_spec_schema()
    jsonschema.validate(yaml.safe_load(COMPOSE.read_text()), schema)


def test_filled_in_from_the_example_env_file_it_still_matches(compose):
    jsonschema.validate(compose, compose_spec_schema())
    assert set(compose["services"]) >= {"postgres", "redis", "migrate", "web", "worker", "worker-gpu", "documents"}


def test_every_variable_it_requires_is_in_the_example_env_file():
    required = {m.group(1) for m in VARIABLE.finditer(COMPOSE.read_text()) if m.group(2) in {":?", "?"}}
    assert required and required <= set(env_example())


def test_every_service_has_a_health_check_and_the_app_waits_for_its_migration(compose):
    services = compose["services"]
    for name, service in services.items():
        assert "healthcheck" in service, name
    assert services["migrate"]["healthcheck"] == {"disable": True}  # one-shot: waited for by its exit
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["restart"] == "no"
    for name in APP_SERVICES:
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in compose["volumes"], (name, volume)


def test_each_process_runs_a_role_the_image_and_the_procfile_have(compose):
    entrypoint = (ROOT / "deploy" / "entrypoint.sh").read_text()
    for name in APP_SERVICES | {"migrate"}:
        (role,) = compose["services"][name]["command"]
        assert re.search(rf"^\s+(\S+ \| )*{role}( \| \S+)*\)$", entrypoint, re.MULTILINE), role
        assert role == "migrate" or role in procfile()


def test_the_health_checks_ask_what_the_service_serves(compose):
    services = compose["services"]
    web_check = services["web"]["healthcheck"]["test"]
    assert view_at(web_check[-1].removeprefix("http://127.0.0.1:8000")) is PROBES["/healthz"]
    for name in ("worker", "worker-2", "worker-gpu", "documents"):
        service = services[name]
        port = service["environment"]["METRICS_WORKER_PORT"]
        assert service["healthcheck"]["test"][-1] == f"http://127.0.0.1:{port}/metrics"
        assert service["environment"]["METRICS_WORKER_HOST"] == "0.0.0.0"


def test_redis_keeps_its_data_and_workers_finish_their_answers(compose):
    command = compose["services"]["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    for name in ("worker", "worker-2", "worker-gpu"):
        minutes = int(compose["services"][name]["stop_grace_period"].removesuffix("m"))
        assert minutes * 60 > settings.INFERENCE_GENERATION_TIMEOUT_S
        assert compose["services"][name]["shm_size"]


def test_workers_on_one_host_bind_cores_of_their_own(compose):
    services = compose["services"]
    first = services["worker"]["environment"]["VLLM_CPU_OMP_THREADS_BIND"]
    second = services["worker-2"]["environment"]["VLLM_CPU_OMP_THREADS_BIND"]
    assert services["worker-2"]["profiles"] == ["scale"]
    scaled = load(WORKER_CPUS="0-3", WORKER_2_CPUS="4-7")["services"]
    assert scaled["worker"]["environment"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    assert scaled["worker-2"]["environment"]["VLLM_CPU_OMP_THREADS_BIND"] == "4-7"
    assert first == "auto" and second != first


def test_the_gpu_worker_takes_nvidia_devices_in_its_profile(compose):
    gpu = compose["services"]["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["count"] >= 1
    assert "profiles" not in compose["services"]["worker"]


def test_every_setting_it_passes_is_one_the_service_reads(compose):
    service, vllm = settings_read(), vllm_settings()
    compose_only = {"POSTGRES_PASSWORD", "WEB_PORT", "CPU_WORKERS"}
    for name in env_example():
        assert name in compose_only or setting_is_read(name, service, vllm), name
    for name in APP_SERVICES:
        for variable in compose["services"][name]["environment"]:
            assert setting_is_read(variable, service, vllm), variable
