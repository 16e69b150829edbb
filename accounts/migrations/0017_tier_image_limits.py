from django.core.validators import MinValueValidator
from django.db import migrations, models

from accounts.defaults import DEFAULT_IMAGE_LIMITS


def set_image_limits(apps, schema_editor):
    """The default tiers get their own bounds; tiers an admin made keep the fields' defaults."""
    Tier = apps.get_model("accounts", "Tier")
    for name, limits in DEFAULT_IMAGE_LIMITS.items():
        Tier.objects.filter(name=name).update(**limits)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0016_identity_providers_and_passkeys"),
    ]

    operations = [
        migrations.AddField(
            model_name="tier",
            name="max_image_bytes",
            field=models.PositiveIntegerField(
                default=10 * 1024 * 1024,
                validators=[MinValueValidator(1024)],
                help_text="The largest image a message or file may carry, as sent (bytes).",
            ),
        ),
        migrations.AddField(
            model_name="tier",
            name="max_image_pixels",
            field=models.PositiveIntegerField(
                default=25_000_000,
                validators=[MinValueValidator(10_000)],
                help_text="The most pixels (width × height) an image may decode to; more is refused unread.",
            ),
        ),
        migrations.RunPython(set_image_limits, migrations.RunPython.noop),
    ]
