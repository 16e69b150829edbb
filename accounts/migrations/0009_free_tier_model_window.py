from django.db import migrations

# The free tier's window cap as the first migration made it, and the default model's own window.
OLD_CAP = 2048
MODEL_WINDOW = 8192


def free_tier_takes_the_model_window(apps, schema_editor):
    """The free tier, still at its first cap, takes the default model's whole window; a cap an
    admin chose stays."""
    Tier = apps.get_model("accounts", "Tier")
    Tier.objects.filter(name="free", max_context=OLD_CAP).update(max_context=MODEL_WINDOW)


def free_tier_back_to_the_old_cap(apps, schema_editor):
    Tier = apps.get_model("accounts", "Tier")
    Tier.objects.filter(name="free", max_context=MODEL_WINDOW).update(max_context=OLD_CAP)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0008_usage_kinds_summary_and_cached"),
    ]

    operations = [
        migrations.RunPython(free_tier_takes_the_model_window, free_tier_back_to_the_old_cap),
    ]
