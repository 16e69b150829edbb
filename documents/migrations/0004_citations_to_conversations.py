"""Citations move to conversations, beside the messages they belong to (conversations 0007 takes
them over): a change of state only, the table and its rows stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("documents", "0003_processing_limits_and_usage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="Citation")],
            database_operations=[],
        ),
    ]
