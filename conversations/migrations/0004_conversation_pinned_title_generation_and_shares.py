import django.db.models.deletion
from django.db import migrations, models

# Full-text search over message text on PostgreSQL (conversations.selectors.conversation_search):
# the expression is the one the query's SearchVector writes, so the planner can use the index.
# SQLite has no such index; its search is a plain substring match.
MESSAGE_FTS_INDEX = "conversations_message_content_fts"


def message_fts_index_create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {MESSAGE_FTS_INDEX} ON conversations_message "
            "USING gin (to_tsvector('simple'::regconfig, COALESCE(content, '')))"
        )


def message_fts_index_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {MESSAGE_FTS_INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0003_message_client_id'),
        ('inference', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='pinned',
            field=models.BooleanField(default=False, help_text="Shown above the others in its owner's list."),
        ),
        migrations.AddField(
            model_name='conversation',
            name='title_generation',
            field=models.OneToOneField(blank=True, help_text='The short generation asked to write the title, once one was asked for.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='titled_conversation', to='inference.generation'),
        ),
        migrations.CreateModel(
            name='SharedConversation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('token', models.CharField(editable=False, max_length=64, unique=True)),
                ('title', models.CharField(max_length=200)),
                ('messages', models.JSONField(default=list, help_text='[{role, content}] as they were when shared.')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('conversation', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='share', to='conversations.conversation')),
            ],
        ),
        migrations.RunPython(message_fts_index_create, message_fts_index_drop),
    ]
