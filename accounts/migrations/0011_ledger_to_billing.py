"""The ledger (prices, usage records) moves to billing, and the tier's list of deployments is
declared on inference.ModelDeployment: both above accounts, pointing down at it. Only the state
changes here; the tables stay, with their rows (billing 0001 and inference 0015 take them over)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0010_file_search_and_request_limits"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(model_name="tier", name="deployments"),
                migrations.DeleteModel(name="TierModelPrice"),
                migrations.DeleteModel(name="UsageRecord"),
            ],
            database_operations=[],
        ),
    ]
