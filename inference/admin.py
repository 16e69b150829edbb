from django.contrib import admin

from inference.models import Generation, ModelDeployment


@admin.register(ModelDeployment)
class ModelDeploymentAdmin(admin.ModelAdmin):
    """Roll-outs are weight changes here: deployments sharing a public name split its new requests by
    weight, and 0 drains one (orchestration.routing)."""

    list_display = (
        "name",
        "public_name",
        "weight",
        "model",
        "engine",
        "max_context",
        "tensor_parallel_size",
        "max_queued",
        "is_enabled",
    )
    list_editable = ("weight", "is_enabled")
    list_filter = ("public_name", "engine", "is_enabled")


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "user",
        "deployment",
        "status",
        "priority",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "routing_reason",
        "created_at",
    )
    list_filter = ("status", "deployment")
    list_select_related = ("user", "deployment")
    readonly_fields = [f.name for f in Generation._meta.fields]
    exclude = ("prompt_token_ids",)
