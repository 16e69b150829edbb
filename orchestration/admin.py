from django.contrib import admin

from orchestration.models import ToolGrant


@admin.register(ToolGrant)
class ToolGrantAdmin(admin.ModelAdmin):
    list_display = ("tool", "deployment", "tier")
    list_filter = ("tool", "deployment", "tier")
