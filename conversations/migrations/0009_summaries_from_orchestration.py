"""A conversation's summaries, taken over from orchestration with their table and rows
(orchestration 0002 let go of them): a change of state only; the content type follows."""

import django.db.models.deletion
from django.db import migrations, models

from chatsite.moves import content_types_moved


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("conversations", "0008_flagged_messages"),
        ("inference", "0015_tier_deployments_declared_here"),
        ("orchestration", "0002_summaries_to_conversations"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ConversationSummary",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("turns_covered", models.PositiveIntegerField(default=0, help_text="Messages of the branch it covers.")),
                        (
                            "status",
                            models.CharField(
                                choices=[("pending", "Pending"), ("ready", "Ready"), ("failed", "Failed")],
                                default="pending",
                                max_length=16,
                            ),
                        ),
                        ("text", models.TextField(blank=True, default="")),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        (
                            "conversation",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="summaries",
                                to="conversations.conversation",
                            ),
                        ),
                        (
                            "generation",
                            models.OneToOneField(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="summary",
                                to="inference.generation",
                            ),
                        ),
                        (
                            "previous",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="conversations.conversationsummary",
                            ),
                        ),
                        (
                            "through",
                            models.ForeignKey(
                                help_text="The last message the summary covers: it covers the branch from the first one to this.",
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="conversations.message",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "orchestration_conversationsummary",
                        "ordering": ["-turns_covered", "-id"],
                        "constraints": [
                            models.UniqueConstraint(
                                condition=models.Q(("status", "pending")),
                                fields=("conversation",),
                                name="summary_one_pending",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        content_types_moved("conversationsummary", source="orchestration", target="conversations"),
    ]
