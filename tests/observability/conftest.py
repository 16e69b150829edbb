from __future__ import annotations

from collections import defaultdict

import httpx
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families


async def scrape(url: str, **headers: str) -> dict[str, dict[frozenset, float]]:
    """Every sample of a /metrics page: name -> {labels: value}."""
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.get(url, headers=headers)
    assert response.status_code == 200, response.text
    samples: dict[str, dict[frozenset, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[sample.name][frozenset(sample.labels.items())] = sample.value
    return samples


def total(samples: dict[str, dict[frozenset, float]], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for key, value in samples.get(name, {}).items() if wanted <= key)


def engine_metrics_url(engine, server: str) -> str:
    """Where the engine's process serves its figures: the web's /metrics in the embedded default,
    the worker's own endpoint in the production topology."""
    return engine.metrics_url if settings.INFERENCE_BACKEND == "celery" else f"{server}/metrics"
