import django.db.models.deletion
from django.db import migrations, models


def tier_names_to_tiers(apps, schema_editor):
    """Point each tier policy at its tier row. A policy naming no existing tier was never applied to
    anyone; it is kept but deactivated, so it cannot become a second global policy."""
    ModerationPolicy = apps.get_model("moderation", "ModerationPolicy")
    Tier = apps.get_model("accounts", "Tier")
    for policy in ModerationPolicy.objects.exclude(tier_name=""):
        policy.tier = Tier.objects.filter(name=policy.tier_name).first()
        if policy.tier is None:
            policy.is_active = False
        policy.save(update_fields=["tier", "is_active"])


def tiers_to_tier_names(apps, schema_editor):
    ModerationPolicy = apps.get_model("moderation", "ModerationPolicy")
    for policy in ModerationPolicy.objects.exclude(tier=None).select_related("tier"):
        policy.tier_name = policy.tier.name
        policy.save(update_fields=["tier_name"])


class Migration(migrations.Migration):
    dependencies = [
        ("moderation", "0002_default_policy_and_moderators"),
        ("accounts", "0003_default_tiers_and_groups"),
    ]

    operations = [
        migrations.AddField(
            model_name="moderationpolicy",
            name="tier",
            field=models.ForeignKey(
                blank=True,
                help_text="The tier this policy is for; empty for the global policy.",
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="moderation_policies",
                to="accounts.tier",
            ),
        ),
        migrations.RunPython(tier_names_to_tiers, tiers_to_tier_names),
        migrations.RemoveConstraint(model_name="moderationpolicy", name="one_active_policy_per_tier"),
        migrations.RemoveField(model_name="moderationpolicy", name="tier_name"),
        migrations.AlterModelOptions(
            name="moderationpolicy",
            options={"ordering": ["tier__name", "name"], "verbose_name_plural": "moderation policies"},
        ),
        migrations.AddConstraint(
            model_name="moderationpolicy",
            constraint=models.UniqueConstraint(
                condition=models.Q(("is_active", True), ("tier__isnull", False)),
                fields=("tier",),
                name="one_active_policy_per_tier",
            ),
        ),
        migrations.AddConstraint(
            model_name="moderationpolicy",
            constraint=models.UniqueConstraint(
                condition=models.Q(("is_active", True), ("tier__isnull", True)),
                fields=("is_active",),
                name="one_active_global_policy",
            ),
        ),
    ]
