"""Conversation summaries move to conversations, the app whose rows they describe (conversations
0009 takes them over): a change of state only, the table and its rows stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("orchestration", "0001_summaries_and_response_cache"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="ConversationSummary")],
            database_operations=[],
        ),
    ]
