"""The Helm chart (charts/chatsite), rendered offline with its default values and with its GPU
values: every object valid for Kubernetes (strict schemas), the chart lint-clean, and every probe,
metric and setting it names one the service has."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from django.conf import settings

from tests.deploy.artefacts import (
    CHART,
    PROBES,
    ROOT,
    metric_names,
    procfile,
    service_series,
    setting_is_read,
    settings_read,
    view_at,
    vllm_series,
    vllm_settings,
)

# The oldest Kubernetes the chart declares (Chart.yaml's kubeVersion), and a recent one.
KUBERNETES = ["1.30", "1.33"]
GPU_VALUES = yaml.safe_load((CHART / "values-gpu.yaml").read_text())
EXTERNAL_VALUES = {
    "postgresql": {"bundled": False, "externalUrl": "postgres://chat:pw@db.internal:5432/chat"},
    "redis": {"bundled": False, "externalUrl": "redis://redis.internal:6379/0"},
    "ingress": {"enabled": False},
    "web": {"autoscaling": {"enabled": False}},
}
VALUES = {"default": {}, "gpu": GPU_VALUES, "external": EXTERNAL_VALUES}

# The custom resources the chart makes, by the fields their operators' CRDs define (KEDA 2.x,
# the Prometheus Operator): kubernetes-validate has only Kubernetes' own kinds.
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "labels": _STRING_MAP}}
_SELECTOR = {"type": "object", "required": ["matchLabels"], "properties": {"matchLabels": _STRING_MAP}}
_ENDPOINT = {
    "port": {"type": "string"},
    "path": {"type": "string", "pattern": "^/"},
    "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
}
CUSTOM_RESOURCES: dict[tuple[str, str], dict[str, Any]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): {
        "type": "object",
        "required": ["scaleTargetRef", "triggers"],
        "additionalProperties": False,
        "properties": {
            "scaleTargetRef": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {k: {"type": "string"} for k in ("name", "apiVersion", "kind", "envSourceContainerName")},
            },
            **{
                k: {"type": "integer", "minimum": 0}
                for k in ("pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "minReplicaCount")
            },
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "advanced": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "restoreToOriginalReplicaCount": {"type": "boolean"},
                    "horizontalPodAutoscalerConfig": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"name": {"type": "string"}, "behavior": {"type": "object"}},
                    },
                },
            },
            "triggers": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["type", "metadata"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"type": "string"},
                        "name": {"type": "string"},
                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                        "metadata": _STRING_MAP,  # KEDA takes strings only
                        "authenticationRef": {"type": "object"},
                    },
                },
            },
        },
    },
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["selector", "endpoints"],
        "additionalProperties": False,
        "properties": {
            "selector": _SELECTOR,
            "endpoints": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        **_ENDPOINT,
                        "authorization": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "type": {"type": "string"},
                                "credentials": {
                                    "type": "object",
                                    "required": ["name", "key"],
                                    "additionalProperties": False,
                                    "properties": {"name": {"type": "string"}, "key": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    ("monitoring.coreos.com/v1", "PodMonitor"): {
        "type": "object",
        "required": ["selector", "podMetricsEndpoints"],
        "additionalProperties": False,
        "properties": {
            "selector": _SELECTOR,
            "podMetricsEndpoints": {
                "type": "array",
                "items": {"type": "object", "additionalProperties": False, "properties": _ENDPOINT},
            },
        },
    },
}


@pytest.fixture(scope="module")
def chart():
    loaded = helm_python.Chart.load(CHART)
    yield loaded
    loaded.close()


def render(chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = chart.render(values, name="chat", namespace="chat", is_install=True)
    return [
        document
        for path, text in sorted(rendered.items())
        if path.endswith((".yaml", ".yml"))
        for document in yaml.safe_load_all(text)
        if document
    ]


@pytest.fixture(scope="module", params=sorted(VALUES))
def objects(request, chart) -> list[dict[str, Any]]:
    return render(chart, VALUES[request.param])


@pytest.fixture(scope="module")
def gpu_objects(chart) -> list[dict[str, Any]]:
    return render(chart, GPU_VALUES)


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] in {"Deployment", "StatefulSet", "Job"} else {}
    return spec.get("initContainers", []) + spec.get("containers", [])


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in container.get("env", [])}


def worker_deployments(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in of_kind(objects, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gpu-worker"
    ]


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_object_is_valid_for_kubernetes(objects, version):
    for obj in objects:
        crd = CUSTOM_RESOURCES.get((obj["apiVersion"], obj["kind"]))
        if crd is not None:
            jsonschema.validate(obj["metadata"], _METADATA)
            jsonschema.validate(obj["spec"], crd)
        else:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("values", ["default", "gpu"])
def test_the_chart_lints_clean_in_strict_mode(values):
    report = helm_python.lint(CHART, VALUES[values], strict=True, kube_version="v1.33.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


def test_every_probe_and_scrape_path_is_one_the_service_serves(objects):
    for obj in objects:
        for container in containers(obj):
            if not container["image"].startswith("registry.example.com/chatsite"):
                continue
            ports = {port["name"]: port["containerPort"] for port in container.get("ports", [])}
            for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
                if probe := container.get(kind, {}).get("httpGet"):
                    if probe["port"] == "metrics":
                        # A GPU worker's own endpoint (prometheus-client's server) on its configured port.
                        env = env_of(container)
                        assert probe["path"] == "/metrics"
                        assert env["METRICS_WORKER_PORT"] == str(ports["metrics"])
                        assert env["METRICS_WORKER_HOST"] == "0.0.0.0"
                    else:
                        assert view_at(probe["path"]) is PROBES[probe["path"]], probe["path"]
    for monitor in of_kind(objects, "ServiceMonitor"):
        for endpoint in monitor["spec"]["endpoints"]:
            assert view_at(endpoint["path"]) is PROBES["/metrics"]


def test_the_web_pods_are_probed_scaled_and_kept_available(objects):
    (web,) = [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-web")]
    container = web["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["args"] == ["web"] and "web" in procfile()
    # Long enough for uvicorn's graceful shutdown (the Procfile's) after the load balancer lets go.
    graceful = int(re.search(r"--timeout-graceful-shutdown (\d+)", procfile()["web"]).group(1))
    assert web["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > graceful + 5
    assert [pdb["spec"]["selector"] for pdb in of_kind(objects, "PodDisruptionBudget")] == [web["spec"]["selector"]]
    for hpa in of_kind(objects, "HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["name"] == web["metadata"]["name"]
        assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    for ingress in of_kind(objects, "Ingress"):
        # WebSockets: nginx keeps a quiet chat socket open this long.
        assert int(ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600


def test_each_gpu_worker_gets_its_gpus_and_scales_on_its_own_queue(gpu_objects):
    workers = {d["metadata"]["labels"]["chatsite.io/deployment"]: d for d in worker_deployments(gpu_objects)}
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in of_kind(gpu_objects, "ScaledObject")}
    assert sorted(workers) == sorted(w["name"] for w in GPU_VALUES["workers"])
    for values in GPU_VALUES["workers"]:
        worker = workers[values["name"]]
        pod = worker["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        tensor_parallel = values.get("tensorParallelSize", 1)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == tensor_parallel
        assert container["args"] == ["worker"] and env_of(container)["DEPLOYMENT"] == values["name"]
        assert pod["nodeSelector"] and pod["tolerations"]
        shm = next(v for v in pod["volumes"] if v["name"] == "shm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        # Warm shutdown: the longest answer finishes before the pod is killed, scaled away or rolled.
        assert pod["terminationGracePeriodSeconds"] > settings.INFERENCE_GENERATION_TIMEOUT_S
        assert worker["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        spec = scaled[worker["metadata"]["name"]]["spec"]
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] and spec["cooldownPeriod"] >= 300
        scale_down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert scale_down["stabilizationWindowSeconds"] >= spec["cooldownPeriod"]
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus"
        assert f'deployment="{values["name"]}"' in trigger["metadata"]["query"]
        assert "chatsite_queue_depth" in metric_names(trigger["metadata"]["query"])


def test_every_metric_the_chart_names_is_one_the_service_or_vllm_exports(objects):
    service, engine = service_series(), vllm_series()
    named: set[str] = set()
    for scaled in of_kind(objects, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            named |= metric_names(trigger["metadata"]["query"])
    for config_map in of_kind(objects, "ConfigMap"):
        for text in config_map.get("data", {}).values():
            named |= metric_names(text)
    unknown = sorted(name for name in named if name not in (engine if name.startswith("vllm:") else service))
    assert unknown == []


def test_the_grafana_dashboard_is_the_one_the_docs_describe(gpu_objects):
    (dashboard,) = [c for c in of_kind(gpu_objects, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert json.loads(dashboard["data"]["chatsite.json"]) == json.loads(
        (ROOT / "docs" / "grafana-dashboard.json").read_text()
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_migrations_run_as_a_hook_before_upgrades_and_pods_wait_for_them(objects):
    (job,) = of_kind(objects, "Job")
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"post-install", "pre-upgrade"}
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    for deployment in of_kind(objects, "Deployment"):
        inits = deployment["spec"]["template"]["spec"]["initContainers"]
        assert [init["args"] for init in inits] == [["wait-for-migrations"]]


def test_every_credential_comes_from_a_secret_and_every_setting_is_read(objects):
    service, vllm = settings_read(), vllm_settings()
    credentials = {"DJANGO_SECRET_KEY", "METRICS_TOKEN", "DATABASE_URL", "REDIS_URL", "POSTGRES_PASSWORD"}
    credentials |= {"MODERATION_GUARD_API_KEY"}
    config = {
        k: v
        for c in of_kind(objects, "ConfigMap")
        if c["metadata"]["name"].endswith("-config")
        for k, v in c["data"].items()
    }
    assert not credentials & set(config)
    for obj in objects:
        for container in containers(obj):
            for name, value in env_of(container).items():
                if name in credentials:
                    assert "secretKeyRef" in value, (obj["metadata"]["name"], name)
                elif container["image"].startswith("registry.example.com/chatsite"):
                    assert setting_is_read(name, service, vllm), name
    for name in config:
        assert setting_is_read(name, service, vllm), name


def test_external_services_replace_the_bundled_ones(chart):
    objects = render(chart, EXTERNAL_VALUES)
    assert of_kind(objects, "StatefulSet") == []
    (secret,) = of_kind(objects, "Secret")
    assert secret["stringData"]["DATABASE_URL"] == EXTERNAL_VALUES["postgresql"]["externalUrl"]
    assert secret["stringData"]["REDIS_URL"] == EXTERNAL_VALUES["redis"]["externalUrl"]
    own = render(chart, {"secrets": {"existingSecret": "chat-credentials"}})
    assert of_kind(own, "Secret") == []
    refs = {
        env["valueFrom"]["secretKeyRef"]["name"]
        for d in of_kind(own, "Deployment")
        for c in containers(d)
        for env in c["env"]
        if "valueFrom" in env
    }
    assert refs == {"chat-credentials"}


def test_bundled_redis_keeps_its_data(objects):
    for redis in [s for s in of_kind(objects, "StatefulSet") if s["metadata"]["name"].endswith("-redis")]:
        args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--appendonly") + 1] == "yes"


def test_further_credentials_reach_every_pod_from_the_secret(chart):
    """An identity provider's client secret (docs/sso.md): in the chart's Secret, or named in a site's own."""
    objects = render(chart, {"secrets": {"extra": {"SSO_CORP_CLIENT_SECRET": "s3cret"}}})
    (secret,) = of_kind(objects, "Secret")
    assert secret["stringData"]["SSO_CORP_CLIENT_SECRET"] == "s3cret"
    web = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-web"))
    for container in containers(web):
        assert env_of(container)["SSO_CORP_CLIENT_SECRET"]["secretKeyRef"]["key"] == "SSO_CORP_CLIENT_SECRET"
    own = render(chart, {"secrets": {"existingSecret": "chat-credentials", "extraKeys": ["SSO_CORP_CLIENT_SECRET"]}})
    for deployment in of_kind(own, "Deployment"):
        for container in containers(deployment):
            if container["image"].startswith("registry.example.com/chatsite"):
                ref = env_of(container)["SSO_CORP_CLIENT_SECRET"]["secretKeyRef"]
                assert ref == {"name": "chat-credentials", "key": "SSO_CORP_CLIENT_SECRET"}
