from django.db import migrations

from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME


def create_default(apps, schema_editor):
    ModelDeployment = apps.get_model("inference", "ModelDeployment")
    ModelDeployment.objects.get_or_create(name=DEFAULT_DEPLOYMENT_NAME, defaults=DEFAULT_DEPLOYMENT_FIELDS)


class Migration(migrations.Migration):
    dependencies = [("inference", "0001_initial")]
    operations = [migrations.RunPython(create_default, migrations.RunPython.noop)]
