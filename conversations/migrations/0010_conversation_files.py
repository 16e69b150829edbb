"""Which conversation each attached file belongs to, kept here, pointing down at the file, in place
of the file's key up to the conversation: the pairs are copied over (documents 0005 then drops the
key), and copied back when this is reversed."""

import django.db.models.deletion
from django.db import migrations, models

COPY = (
    "INSERT INTO conversations_conversationfile (document_id, conversation_id) "
    "SELECT id, conversation_id FROM documents_document WHERE conversation_id IS NOT NULL"
)
COPY_BACK = (
    "UPDATE documents_document SET conversation_id = (SELECT f.conversation_id FROM conversations_conversationfile f "
    "WHERE f.document_id = documents_document.id)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0009_summaries_from_orchestration"),
        ("documents", "0004_citations_to_conversations"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConversationFile",
            fields=[
                (
                    "document",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="conversation_link",
                        serialize=False,
                        to="documents.document",
                    ),
                ),
                (
                    "conversation",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="file_links",
                        to="conversations.conversation",
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="conversation",
            name="documents",
            field=models.ManyToManyField(
                related_name="conversations",
                related_query_name="conversation",
                through="conversations.ConversationFile",
                to="documents.document",
            ),
        ),
        migrations.RunSQL(COPY, COPY_BACK),
    ]
