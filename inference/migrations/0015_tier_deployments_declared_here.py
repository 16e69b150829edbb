"""The tiers' deployments, declared here (pointing down at accounts.Tier) on the table accounts made:
a change of state only, the rows stay where they are."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0011_ledger_to_billing"),
        ("inference", "0014_deployment_engine"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="modeldeployment",
                    name="tiers",
                    field=models.ManyToManyField(
                        blank=True,
                        db_table="accounts_tier_deployments",
                        help_text="The tiers that may use it (besides those with every deployment).",
                        related_name="deployments",
                        to="accounts.tier",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
