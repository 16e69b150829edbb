"""A flag no longer holds a key up to its message: conversations keeps which message each flag is
about (conversations 0008, which copied the pairs first)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0008_flagged_messages"),
        ("moderation", "0003_policy_tier_foreign_key"),
    ]

    operations = [
        migrations.RemoveField(model_name="flag", name="message"),
    ]
