"""An answer's citations, taken over from documents with their table and rows (documents 0004 let
go of them): a change of state only; the content type follows."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from chatsite.moves import content_types_moved


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("conversations", "0006_conversation_model_name"),
        ("documents", "0004_citations_to_conversations"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Citation",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("number", models.PositiveSmallIntegerField(default=0)),
                        ("file_name", models.CharField(max_length=255)),
                        ("page", models.PositiveIntegerField(blank=True, null=True)),
                        ("heading", models.CharField(blank=True, default="", max_length=300)),
                        ("passage", models.TextField(blank=True, default="")),
                        ("withheld", models.BooleanField(default=False)),
                        (
                            "document",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="documents.document",
                            ),
                        ),
                        (
                            "message",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="citations",
                                to="conversations.message",
                            ),
                        ),
                        (
                            "owner",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "documents_citation",
                        "ordering": ["message_id", "withheld", "number", "id"],
                        "indexes": [models.Index(fields=["owner", "message"], name="documents_c_owner_i_3abb11_idx")],
                    },
                ),
            ],
            database_operations=[],
        ),
        content_types_moved("citation", source="documents", target="conversations"),
    ]
