from django.contrib import admin

from inference.models import Generation, ModelDeployment


@admin.register(ModelDeployment)
class ModelDeploymentAdmin(admin.ModelAdmin):
    list_display = ("name", "model", "max_context", "tensor_parallel_size", "max_queued", "is_enabled", "weight")
    list_editable = ("is_enabled",)


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "user",
        "deployment",
        "status",
        "priority",
        "prompt_tokens",
        "completion_tokens",
        "created_at",
    )
    list_filter = ("status", "deployment")
    list_select_related = ("user", "deployment")
    readonly_fields = [f.name for f in Generation._meta.fields]
    exclude = ("prompt_token_ids",)
