from django.db import migrations

# A frozen copy of moderation.defaults.DEFAULT_RULES as it was when this migration was written.
RULES = {
    "harassment": (0.8, "warn"),
    "harassment/threatening": (0.6, "block_and_review"),
    "hate": (0.6, "block"),
    "hate/threatening": (0.5, "block_and_review"),
    "illicit": (0.7, "block"),
    "illicit/violent": (0.6, "block_and_review"),
    "self-harm": (0.6, "warn"),
    "self-harm/intent": (0.5, "warn"),
    "self-harm/instructions": (0.6, "block_and_review"),
    "sexual": (0.7, "block"),
    "sexual/minors": (0.5, "block_and_review"),
    "violence": (0.8, "warn"),
    "violence/graphic": (0.7, "block"),
    "prompt-injection": (0.8, "block_and_review"),
}


def forwards(apps, schema_editor):
    ModerationPolicy = apps.get_model("moderation", "ModerationPolicy")
    PolicyRule = apps.get_model("moderation", "PolicyRule")
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ContentType = apps.get_model("contenttypes", "ContentType")

    if not ModerationPolicy.objects.filter(tier_name="", is_active=True).exists():
        policy = ModerationPolicy.objects.create(name="Default", tier_name="")
        PolicyRule.objects.bulk_create(
            PolicyRule(policy=policy, category=category, threshold=threshold, action=action)
            for category, (threshold, action) in RULES.items()
        )

    # Permissions are normally created after all migrations; this group needs one now.
    content_type, _ = ContentType.objects.get_or_create(app_label="moderation", model="flag")
    permission, _ = Permission.objects.get_or_create(
        content_type=content_type,
        codename="review_flag",
        defaults={"name": "Can see flagged messages and decide on them"},
    )
    group, _ = Group.objects.get_or_create(name="Moderators")
    group.permissions.add(permission)


def backwards(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="Moderators").delete()
    apps.get_model("moderation", "ModerationPolicy").objects.filter(name="Default", tier_name="").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("moderation", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
