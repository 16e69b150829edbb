from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from accounts.forms import ThrottledAdminAuthenticationForm, parse_month
from accounts.models import ApiKey, Tier, TierModelPrice, UsageRecord, User
from accounts.selectors import month_bounds, usage_by_user
from accounts.services import login_unlock

# The same per-account and per-address sign-in buckets as the site's own page, so guessing a staff
# password through /admin/login/ is no faster than through /accounts/login/.
admin.site.login_form = ThrottledAdminAuthenticationForm


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    list_display = ("username", "email", "tier", "is_staff", "is_active")
    list_filter = ("tier", *BaseUserAdmin.list_filter)
    list_select_related = ("tier",)
    fieldsets = (*(BaseUserAdmin.fieldsets or ()), ("Plan", {"fields": ("tier",)}))
    actions = ["unlock_sign_in"]

    @admin.action(description="Unlock sign-in for the selected users (after too many failed attempts)")
    def unlock_sign_in(self, request: HttpRequest, queryset) -> None:
        usernames = list(queryset.values_list("username", flat=True))
        login_unlock(usernames=usernames)
        self.message_user(request, f"Unlocked sign-in for {len(usernames)} users.")


class TierModelPriceInline(admin.TabularInline):
    model = TierModelPrice
    extra = 1


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "display_name",
        "is_default",
        "priority",
        "requests_per_minute",
        "tokens_per_minute",
        "tokens_per_day",
        "tokens_per_month",
        "max_context",
        "max_output_tokens",
    )
    filter_horizontal = ("deployments",)
    inlines = [TierModelPriceInline]
    fieldsets = (
        (None, {"fields": ("name", "display_name", "is_default", "priority")}),
        ("Models", {"fields": ("all_deployments", "deployments")}),
        (
            "Limits (empty means no limit)",
            {
                "fields": (
                    "requests_per_minute",
                    "tokens_per_minute",
                    "tokens_per_day",
                    "tokens_per_month",
                    "max_context",
                    "max_output_tokens",
                )
            },
        ),
        (
            "Other endpoints, per user (empty means no limit)",
            {
                "fields": (
                    "moderations_per_minute",
                    "model_lists_per_minute",
                    "conversations_per_hour",
                    "api_keys_per_day",
                    "file_uploads_per_hour",
                    "documents_per_day",
                    "file_searches_per_minute",
                    "other_requests_per_minute",
                )
            },
        ),
    )


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are made by their owners (the secret is shown to them once); admins can see and revoke."""

    list_display = ("name", "display_key", "user", "created_at", "expires_at", "revoked_at", "last_used_at")
    list_filter = ("revoked_at",)
    list_select_related = ("user",)
    search_fields = ("name", "prefix", "user__username")
    fields = (
        "user",
        "name",
        "prefix",
        "scopes",
        "requests_per_minute",
        "tokens_per_minute",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    )
    readonly_fields = ("user", "name", "prefix", "scopes", "created_at", "last_used_at")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset) -> None:
        count = queryset.filter(revoked_at=None).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} keys.")


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "user",
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
            path("by-user/", self.admin_site.admin_view(self.by_user_view), name="accounts_usagerecord_by_user"),
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
        return TemplateResponse(request, "admin/accounts/usagerecord/by_user.html", context)
