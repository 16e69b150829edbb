from __future__ import annotations

import csv
import datetime as dt
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from accounts.authentication import AuthenticatedHttpRequest
from accounts.forms import parse_month
from accounts.metering import metered
from accounts.selectors import quota_status_for_user, tier_for_user
from billing.selectors import usage_figures, usage_statement_rows, usage_summary

CHART_HEIGHT = 120


@metered("request")
@login_required
@require_GET
def usage(request: AuthenticatedHttpRequest) -> HttpResponse:
    today = timezone.now().date()
    try:
        month = parse_month(request.GET.get("month"), today=today)
    except ValueError:
        return HttpResponseBadRequest("The month must look like 2026-11.", content_type="text/plain")
    summary = usage_summary(user=request.user, month=month)
    peak = max((day["tokens"] for day in summary.per_day), default=0) or 1
    width = 100 / len(summary.per_day)
    bars = [
        {
            **day,
            "x": f"{i * width:.3f}",
            "width": f"{width * 0.8:.3f}",
            "height": round(day["tokens"] / peak * CHART_HEIGHT, 1),
            "y": round(CHART_HEIGHT - day["tokens"] / peak * CHART_HEIGHT, 1),
        }
        for i, day in enumerate(summary.per_day)
    ]
    previous = (month.replace(day=1) - dt.timedelta(days=1)).replace(day=1)
    following = (month.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    return render(
        request,
        "billing/usage.html",
        {
            "summary": summary,
            "month": month,
            "month_param": f"{month:%Y-%m}",
            "previous": f"{previous:%Y-%m}",
            "following": f"{following:%Y-%m}" if following <= today else None,
            "bars": bars,
            "last_day": summary.per_day[-1]["day"],
            "chart_height": CHART_HEIGHT,
            "tier": tier_for_user(user=request.user),
            "figures": usage_figures(user=request.user),
            "quota": quota_status_for_user(user=request.user),
        },
    )


@metered("request")
@login_required
@require_GET
def usage_statement(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The month's ledger as CSV: one line per generation, then the total."""
    try:
        month = parse_month(request.GET.get("month"), today=timezone.now().date())
    except ValueError:
        return HttpResponseBadRequest("The month must look like 2026-11.", content_type="text/plain")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="statement-{month:%Y-%m}.csv"'
    writer = csv.writer(response)
    writer.writerow(
        [
            "time (UTC)",
            "generation",
            "model",
            "tier",
            "status",
            "prompt tokens",
            "completion tokens",
            f"prompt price per 1k ({settings.BILLING_CURRENCY})",
            f"completion price per 1k ({settings.BILLING_CURRENCY})",
            f"cost ({settings.BILLING_CURRENCY})",
        ]
    )
    total = Decimal("0")
    tokens = [0, 0]
    for row in usage_statement_rows(user=request.user, month=month):
        writer.writerow(
            [
                row.created_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
                row.generation_id or "",
                row.model_name,
                row.tier.name if row.tier else "",
                row.status,
                row.prompt_tokens,
                row.completion_tokens,
                row.prompt_price_per_1k,
                row.completion_price_per_1k,
                row.cost,
            ]
        )
        total += row.cost
        tokens[0] += row.prompt_tokens
        tokens[1] += row.completion_tokens
    writer.writerow(["total", "", "", "", "", tokens[0], tokens[1], "", "", total])
    return response
