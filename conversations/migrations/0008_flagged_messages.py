"""Which message each moderation flag is about, kept here, pointing down at the flag, in place of
the flag's key up to the message: the pairs are copied over (moderation 0004 then drops the key),
and copied back when this is reversed."""

import django.db.models.deletion
from django.db import migrations, models

COPY = (
    "INSERT INTO conversations_flaggedmessage (flag_id, message_id) "
    "SELECT id, message_id FROM moderation_flag WHERE message_id IS NOT NULL"
)
COPY_BACK = (
    "UPDATE moderation_flag SET message_id = (SELECT f.message_id FROM conversations_flaggedmessage f "
    "WHERE f.flag_id = moderation_flag.id)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0007_citations_from_documents"),
        ("moderation", "0003_policy_tier_foreign_key"),
    ]

    operations = [
        migrations.CreateModel(
            name="FlaggedMessage",
            fields=[
                (
                    "flag",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="message_link",
                        serialize=False,
                        to="moderation.flag",
                    ),
                ),
                (
                    "message",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="flag_links",
                        to="conversations.message",
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="message",
            name="moderation_flags",
            field=models.ManyToManyField(
                related_name="messages",
                related_query_name="message",
                through="conversations.FlaggedMessage",
                to="moderation.flag",
            ),
        ),
        migrations.RunSQL(COPY, COPY_BACK),
    ]
