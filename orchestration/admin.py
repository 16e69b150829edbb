from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.http import HttpRequest

from orchestration.models import McpServer, ToolGrant


class McpServerForm(forms.ModelForm):
    """A stdio server runs a command on this machine with the service's rights: only a superuser may
    add one or change its command, whatever other permissions a staff member holds."""

    may_run_commands = False

    class Meta:
        model = McpServer
        fields = [
            "name",
            "enabled",
            "tiers",
            "timeout_s",
            "transport",
            "url",
            "auth_header",
            "auth_env_var",
            "command",
            "args",
        ]
        widgets = {"tiers": FilteredSelectMultiple("tiers", is_stacked=False)}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        stdio = cleaned.get("transport") == McpServer.Transport.STDIO
        changed = {"transport", "command", "args"} & set(self.changed_data)
        if not self.may_run_commands and (stdio or cleaned.get("command")) and changed:
            raise forms.ValidationError("Only a superuser may add a stdio server or change its command.")
        return cleaned


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    form = McpServerForm
    list_display = ["name", "transport", "url", "command", "enabled", "timeout_s", "updated_at"]
    list_filter = ["enabled", "transport", "tiers"]
    search_fields = ["name", "url", "command"]
    fieldsets = [
        (None, {"fields": ["name", "enabled", "tiers", "timeout_s", "transport"]}),
        ("Streamable HTTP", {"fields": ["url", "auth_header", "auth_env_var"]}),
        ("stdio", {"fields": ["command", "args"]}),
    ]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        # A class of the request's own: the flag must not leak to another request's form.
        return type(form.__name__, (form,), {"may_run_commands": request.user.is_superuser})


@admin.register(ToolGrant)
class ToolGrantAdmin(admin.ModelAdmin):
    """Which tools the service runs a deployment's model may call, for a plan or for every plan (docs/tools.md)."""

    list_display = ("tool", "deployment", "tier")
    list_filter = ("tool", "deployment", "tier")
