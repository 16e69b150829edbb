"""Policies, and the review queue for flagged messages.

The queue shows message content, so it is open only to holders of `moderation.review_flag` (the
"Moderators" group, and superusers): Django's per-model view/change permissions on Flag are not
enough, and ordinary staff do not see the queue at all. Decisions go through the services, which
record the reviewer and the time.
"""

from __future__ import annotations

from typing import cast

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponseRedirect
from django.utils.html import format_html, format_html_join

from accounts.models import User
from moderation.models import Flag, ModerationPolicy, PolicyRule
from moderation.selectors import flag_context, flag_list_for_review
from moderation.services import flag_confirm, flag_dismiss, flag_suspend_user, flag_warn_user

REVIEW_PERMISSION = "moderation.review_flag"


def can_review(request: HttpRequest) -> bool:
    return request.user.is_active and request.user.is_staff and request.user.has_perm(REVIEW_PERMISSION)


class PolicyRuleInline(admin.TabularInline):
    model = PolicyRule
    extra = 0


@admin.register(ModerationPolicy)
class ModerationPolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "tier", "is_active", "moderate_input", "moderate_output", "updated_at")
    list_filter = ("is_active", "tier")
    inlines = [PolicyRuleInline]


# (button/POST name, service, past tense for the confirmation message)
DECISIONS = {
    "_dismiss": (flag_dismiss, "dismissed as a false positive"),
    "_confirm": (flag_confirm, "confirmed"),
    "_warn_user": (flag_warn_user, "confirmed; the user is warned"),
    "_suspend_user": (flag_suspend_user, "confirmed; the user is suspended"),
}


@admin.register(Flag)
class FlagAdmin(admin.ModelAdmin):
    change_form_template = "admin/moderation/flag/change_form.html"
    list_display = ("id", "created_at", "source", "user", "categories_display", "action", "review_state", "reviewer")
    list_filter = ("review_state", "source", "action", "user_action")
    search_fields = ("user__username",)
    date_hierarchy = "created_at"
    fields = (
        "user",
        "source",
        "action",
        "categories_display",
        "scores_display",
        "context_display",
        "text",
        "review_state",
        "user_action",
        "reviewer",
        "reviewed_at",
        "decision_note",
    )
    readonly_fields = tuple(f for f in fields if f != "decision_note")
    actions = ["dismiss_selected", "confirm_selected", "warn_selected_users", "suspend_selected_users"]

    def get_queryset(self, request: HttpRequest):
        return flag_list_for_review()

    # --- who may see it ---------------------------------------------------------------------------

    def has_module_permission(self, request: HttpRequest) -> bool:
        return can_review(request)

    def has_view_permission(self, request: HttpRequest, obj: Flag | None = None) -> bool:
        return can_review(request)

    def has_change_permission(self, request: HttpRequest, obj: Flag | None = None) -> bool:
        return can_review(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Flag | None = None) -> bool:
        return False  # the record of what was flagged and decided is kept

    # --- display ----------------------------------------------------------------------------------

    @admin.display(description="categories")
    def categories_display(self, flag: Flag) -> str:
        return ", ".join(flag.categories) or "—"

    @admin.display(description="scores")
    def scores_display(self, flag: Flag) -> str:
        top = sorted(flag.category_scores.items(), key=lambda item: item[1], reverse=True)[:6]
        return format_html_join(", ", "{}: {}", ((name, f"{score:.2f}") for name, score in top))

    @admin.display(description="conversation")
    def context_display(self, flag: Flag) -> str:
        context = flag_context(flag=flag)
        if not context.turns:
            return "—"
        flagged = context.message_id
        return format_html(
            "<div>{}</div>",
            format_html_join(
                "",
                '<p style="margin:0 0 .5em;{}"><strong>{}</strong> ({}): {}</p>',
                (
                    ("background:#fff3cd;" if m.id == flagged else "", m.role, m.status, m.content)
                    for m in context.turns
                ),
            ),
        )

    # --- decisions --------------------------------------------------------------------------------

    def response_change(self, request: HttpRequest, obj: Flag):
        for name, (service, done) in DECISIONS.items():
            if name in request.POST:
                try:
                    service(flag=obj, reviewer=cast(User, request.user), note=obj.decision_note)  # staff: signed in
                except ValueError as exc:
                    self.message_user(request, str(exc), messages.ERROR)
                    return HttpResponseRedirect(request.path)
                self.message_user(request, f"Flag {obj.pk} {done}.", messages.SUCCESS)
                return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    def _decide_many(self, request: HttpRequest, queryset, service, done: str) -> None:
        count = 0
        for flag in queryset:
            try:
                service(flag=flag, reviewer=request.user)
            except ValueError as exc:
                self.message_user(request, f"Flag {flag.pk}: {exc}", messages.ERROR)
                continue
            count += 1
        self.message_user(request, f"{count} flag(s) {done}.", messages.SUCCESS)

    @admin.action(description="Dismiss as false positive")
    def dismiss_selected(self, request, queryset) -> None:
        self._decide_many(request, queryset, flag_dismiss, "dismissed")

    @admin.action(description="Confirm")
    def confirm_selected(self, request, queryset) -> None:
        self._decide_many(request, queryset, flag_confirm, "confirmed")

    @admin.action(description="Confirm and warn the user")
    def warn_selected_users(self, request, queryset) -> None:
        self._decide_many(request, queryset, flag_warn_user, "confirmed with a warning")

    @admin.action(description="Confirm and suspend the user")
    def suspend_selected_users(self, request, queryset) -> None:
        self._decide_many(request, queryset, flag_suspend_user, "confirmed; users suspended")
