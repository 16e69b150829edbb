from django.db import migrations

# Frozen copies of inference.defaults' names, as they were when this migration was written.
DEFAULT_DEPLOYMENT_NAME = "smollm2-135m"
DEFAULT_MODEL = "SmolLM2-135M-Instruct"
# The window the default deployment had, and the default model's own (its max_position_embeddings).
OLD_WINDOW = 2048
MODEL_WINDOW = 8192


def default_deployment_serves_the_model_window(apps, schema_editor):
    """The default deployment, on the default model with the old default window, serves the model's
    own window; a window an operator chose stays."""
    ModelDeployment = apps.get_model("inference", "ModelDeployment")
    ModelDeployment.objects.filter(name=DEFAULT_DEPLOYMENT_NAME, model=DEFAULT_MODEL, max_context=OLD_WINDOW).update(
        max_context=MODEL_WINDOW
    )


def default_deployment_back_to_the_old_window(apps, schema_editor):
    ModelDeployment = apps.get_model("inference", "ModelDeployment")
    ModelDeployment.objects.filter(name=DEFAULT_DEPLOYMENT_NAME, model=DEFAULT_MODEL, max_context=MODEL_WINDOW).update(
        max_context=OLD_WINDOW
    )


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0012_deployment_memory_and_cache_generation_cached"),
    ]

    operations = [
        migrations.RunPython(default_deployment_serves_the_model_window, default_deployment_back_to_the_old_window),
    ]
