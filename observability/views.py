"""/metrics, /healthz, /readyz, and the operations page in the admin.

/metrics and /readyz's details are for the operators' own systems: a request bearing METRICS_TOKEN
(`Authorization: Bearer …`), or, when no token is set, one from a loopback or private address that
came through no proxy (a proxy's X-Forwarded-For means the caller may be anyone).
"""

from __future__ import annotations

import hmac
import ipaddress
import time

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from observability import health, metrics, store
from observability.selectors import generations_by_state, workers_list


def _internal(request: HttpRequest) -> bool:
    if "HTTP_X_FORWARDED_FOR" in request.META or "HTTP_FORWARDED" in request.META:
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return address.is_loopback or address.is_private


def _access(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may read operational data, else the refusal to send it."""
    token = settings.METRICS_TOKEN
    if token:
        sent = request.headers.get("Authorization", "")
        if sent.startswith("Bearer ") and hmac.compare_digest(sent[7:].encode(), token.encode()):
            return None
        response = HttpResponse("A bearer token is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if _internal(request):
        return None
    return HttpResponse("Not available from this address.\n", status=403, content_type="text/plain")


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = _access(request)
    if refusal is not None:
        return refusal
    return HttpResponse(metrics.exposition(), content_type=CONTENT_TYPE_LATEST)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """The process answers: nothing else is asked, so a slow database never restarts a web process."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the service can take messages, else 503; details only for the operators' systems."""
    result = health.readiness()
    body = result if _access(request) is None else {"ready": result["ready"]}
    return JsonResponse(body, status=200 if result["ready"] else 503)


def operations_page(request: HttpRequest) -> TemplateResponse:
    context = {**admin.site.each_context(request), "title": "Operations"}
    return TemplateResponse(request, "admin/operations.html", context)


@never_cache
def operations_data(request: HttpRequest) -> JsonResponse:
    """The page's figures: the last hour per minute from the rolling store, and workers and queues now.
    Each read also records the queue depth now, so the chart has it for every minute someone looked."""
    counts = generations_by_state()
    depth: dict[str, int] = {}
    for (deployment, _priority), n in counts["queued"].items():
        depth[deployment] = depth.get(deployment, 0) + n
    for deployment in set(depth) | set(counts["running"]):
        store.sample_add({"k": "q", "d": deployment, "n": depth.get(deployment, 0)})
    try:
        workers = workers_list()
    except Exception as exc:
        workers = [{"name": f"(unavailable: {type(exc).__name__})", "engines": {}, "queues": []}]
    return JsonResponse(
        {
            "now": time.time(),
            "series": store.series_last_hour(),
            "workers": workers,
            "queues": [{"deployment": d, "priority": p, "queued": n} for (d, p), n in sorted(counts["queued"].items())],
            "running": counts["running"],
        }
    )


def admin_urls() -> list:
    """The operations page and its data, staff only through the admin's own check."""
    from django.urls import path

    return [
        path("admin/operations/", admin.site.admin_view(operations_page), name="admin-operations"),
        path("admin/operations/data/", admin.site.admin_view(operations_data), name="admin-operations-data"),
    ]
