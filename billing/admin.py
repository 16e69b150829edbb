from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from accounts.admin import TierAdmin as AccountsTierAdmin
from accounts.forms import parse_month
from accounts.models import Tier
from accounts.selectors import month_bounds
from billing.models import TierModelPrice, UsageRecord
from billing.selectors import usage_by_user
from inference.models import ModelDeployment


class TierModelPriceInline(admin.TabularInline):
    model = TierModelPrice
    extra = 1


class TierForm(forms.ModelForm):
    """The tier's own fields, and the deployments it may use: a list inference keeps
    (ModelDeployment.tiers, pointing down at the tier), edited here from the tier's side."""

    deployments = forms.ModelMultipleChoiceField(
        queryset=ModelDeployment.objects.all(),
        required=False,
        widget=FilteredSelectMultiple("deployments", is_stacked=False),
        help_text="Deployments this tier may use.",
    )

    class Meta:
        model = Tier
        fields: list[str] = []  # the admin's fieldsets choose them

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["deployments"].initial = self.instance.deployments.all()

    def _save_m2m(self) -> None:
        super()._save_m2m()  # type: ignore[misc]
        self.instance.deployments.set(self.cleaned_data["deployments"])


# The tier's page as an admin edits it: accounts' fields, with the models it may use (inference)
# and what it pays for them (billing), which accounts, the lower layer, cannot name.
admin.site.unregister(Tier)


@admin.register(Tier)
class TierAdmin(AccountsTierAdmin):
    form = TierForm
    inlines = [TierModelPriceInline]

    def get_fieldsets(self, request: HttpRequest, obj: Tier | None = None) -> Any:
        return [
            (name, {**options, "fields": (*options["fields"], "deployments")} if name == "Models" else options)
            for name, options in super().get_fieldsets(request, obj)
        ]


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "user",
        "former_account",
        "kind",
        "deployment",
        "tier",
        "status",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "cost",
    )
    list_filter = ("kind", "tier", "deployment", "status", ("created_at", admin.DateFieldListFilter))
    list_select_related = ("user", "deployment", "tier")
    search_fields = ("user__username", "generation__id")
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in UsageRecord._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def get_urls(self):
        return [
            path("by-user/", self.admin_site.admin_view(self.by_user_view), name="billing_usagerecord_by_user"),
            *super().get_urls(),
        ]

    def by_user_view(self, request: HttpRequest) -> HttpResponse:
        """Usage across users for one month (?month=YYYY-MM), most expensive first."""
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        try:
            month = parse_month(request.GET.get("month"), today=timezone.now().date())
        except ValueError:
            return HttpResponseBadRequest("The month must look like 2026-11.", content_type="text/plain")
        start, end = month_bounds(month)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Usage by user, {month:%B %Y}",
            "opts": self.model._meta,
            "rows": list(usage_by_user(start=start, end=end)[:500]),
            "month": f"{month:%Y-%m}",
        }
        return TemplateResponse(request, "admin/billing/usagerecord/by_user.html", context)
