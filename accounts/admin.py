from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone

from accounts.models import ApiKey, ExternalIdentity, IdentityProvider, Passkey, Tier, User
from accounts.services import login_unlock


def admin_login(request: HttpRequest, extra_context=None) -> HttpResponse:
    """The admin signs in through the site's own page: its throttling per account and address, and its
    second factor (docs/accounts.md), hold for staff too, where the admin's own form would sign them
    in with a password alone. A signed-in user who is not staff is refused here rather than shown a
    form to sign in again."""
    target = request.GET.get(REDIRECT_FIELD_NAME) or reverse("admin:index")
    if request.user.is_authenticated:
        if admin.site.has_permission(request):
            return redirect(reverse("admin:index"))
        return HttpResponseForbidden("This account may not use the admin.")
    return redirect_to_login(target, login_url=reverse("accounts:login"))


admin.site.login = admin_login  # type: ignore[method-assign]


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
    fieldsets = (
        (None, {"fields": ("name", "display_name", "is_default", "priority")}),
        ("Models", {"fields": ("all_deployments",)}),
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


@admin.register(IdentityProvider)
class IdentityProviderAdmin(admin.ModelAdmin):
    """Identity providers added here beside the environment's (docs/sso.md); the client secret stays
    in the environment, named by `client_secret_env`."""

    list_display = ("slug", "label", "preset", "issuer", "enabled")
    list_filter = ("preset", "enabled")


class ExternalIdentityInline(admin.TabularInline):
    model = ExternalIdentity
    extra = 0
    fields = ("provider", "subject", "email", "created_at", "last_used_at")
    readonly_fields = fields
    can_delete = True


class PasskeyInline(admin.TabularInline):
    model = Passkey
    extra = 0
    fields = ("name", "created_at", "last_used_at", "sign_count")
    readonly_fields = fields
    can_delete = True


UserAdmin.inlines = [*UserAdmin.inlines, ExternalIdentityInline, PasskeyInline]
