"""A file no longer holds a key up to its conversation: conversations keeps which conversation each
attached file belongs to (conversations 0010, which copied the pairs first)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0010_conversation_files"),
        ("documents", "0004_citations_to_conversations"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="document", name="documents_d_convers_cc70df_idx"),
        migrations.RemoveField(model_name="document", name="conversation"),
    ]
