from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0007_process_heartbeat'),
    ]

    operations = [
        migrations.AddField(
            model_name='generation',
            name='purpose',
            field=models.CharField(choices=[('answer', 'Answer'), ('title', 'Title')], default='answer', max_length=16),
        ),
    ]
