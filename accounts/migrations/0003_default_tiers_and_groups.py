"""The four tiers with sensible defaults, prices for the default deployment, and the staff groups.

Everything here is a starting point that admins edit; nothing in code depends on these numbers.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from accounts.defaults import DEFAULT_TIER_NAME, create_default_tiers, create_staff_groups

# A frozen copy of inference.defaults.DEFAULT_DEPLOYMENT_NAME as it was when this migration was written.
DEFAULT_DEPLOYMENT_NAME = "smollm2-135m"


def create_tiers(apps, schema_editor):
    Tier = apps.get_model("accounts", "Tier")
    TierModelPrice = apps.get_model("accounts", "TierModelPrice")
    ModelDeployment = apps.get_model("inference", "ModelDeployment")
    User = apps.get_model("accounts", "User")
    deployment = ModelDeployment.objects.filter(name=DEFAULT_DEPLOYMENT_NAME).first()
    create_default_tiers(tier_model=Tier, price_model=TierModelPrice, deployment=deployment)
    User.objects.filter(tier=None).update(tier=Tier.objects.get(name=DEFAULT_TIER_NAME))


def create_groups(apps, schema_editor):
    # Permissions are normally created after all migrations; make sure the ones we grant exist now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    create_staff_groups(group_model=Group, permission_model=apps.get_model("auth", "Permission"))


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0002_tiers_api_keys_usage"),
        ("inference", "0003_modeldeployment_max_queued"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [
        migrations.RunPython(create_tiers, migrations.RunPython.noop),
        migrations.RunPython(create_groups, migrations.RunPython.noop),
    ]
