"""Each plan's bounds on one file's processing (what it unpacks to, pages, paragraphs, passages,
time, memory), the default tiers' values from accounts.defaults, and whether a file's processing is
on its owner's ledger."""

import django.core.validators
from django.db import migrations, models

from accounts.defaults import DEFAULT_DOCUMENT_PROCESSING_LIMITS


def processing_limits_set(apps, schema_editor):
    TierDocumentLimits = apps.get_model("documents", "TierDocumentLimits")
    for name, limits in DEFAULT_DOCUMENT_PROCESSING_LIMITS.items():
        TierDocumentLimits.objects.filter(tier__name=name).update(**limits)


class Migration(migrations.Migration):
    dependencies = [
        ("documents", "0002_search_index_and_tier_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="document",
            name="usage_charged",
            field=models.BooleanField(
                default=False,
                help_text="Its processing's tokens are on its owner's ledger (charged once, never again).",
            ),
        ),
        migrations.AddField(
            model_name="tierdocumentlimits",
            name="max_chunks",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Passages one file is cut into.",
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.AddField(
            model_name="tierdocumentlimits",
            name="max_pages",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Pages of a PDF.",
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.AddField(
            model_name="tierdocumentlimits",
            name="max_paragraphs",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Paragraphs of one file, empty ones too.",
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.AddField(
            model_name="tierdocumentlimits",
            name="max_unpacked_bytes",
            field=models.PositiveBigIntegerField(
                blank=True,
                help_text="What an archive format (DOCX) may unpack to, all its parts together.",
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.AddField(
            model_name="tierdocumentlimits",
            name="processing_memory_mb",
            field=models.PositiveIntegerField(
                default=512,
                help_text="Memory reading one file may take, beyond its own bytes (MiB).",
                validators=[django.core.validators.MinValueValidator(16)],
            ),
        ),
        migrations.AddField(
            model_name="tierdocumentlimits",
            name="processing_seconds",
            field=models.PositiveIntegerField(
                default=60,
                help_text="Wall-clock time one file's processing may take.",
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.RunPython(processing_limits_set, migrations.RunPython.noop),
    ]
