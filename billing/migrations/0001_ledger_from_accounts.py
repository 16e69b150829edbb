"""The ledger's models, taken over from accounts with their tables and rows (accounts 0011 let go
of them): a change of state only. The content types follow, so the permissions granted on them
stay granted."""

import django.core.validators
import django.db.models.deletion
import django.utils.timezone
from decimal import Decimal
from django.conf import settings
from django.db import migrations, models

from chatsite.moves import content_types_moved


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0011_ledger_to_billing'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('inference', '0015_tier_deployments_declared_here'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='TierModelPrice',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('prompt_price_per_1k', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=12, validators=[django.core.validators.MinValueValidator(Decimal('0'))])),
                        ('completion_price_per_1k', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=12, validators=[django.core.validators.MinValueValidator(Decimal('0'))])),
                        ('cached_prompt_price_per_1k', models.DecimalField(blank=True, decimal_places=6, help_text='Per 1,000 prompt tokens the engine found in its prefix cache. Empty: the prompt price.', max_digits=12, null=True, validators=[django.core.validators.MinValueValidator(Decimal('0'))])),
                        ('deployment', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='prices', to='inference.modeldeployment')),
                        ('tier', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='prices', to='accounts.tier')),
                    ],
                    options={
                        'db_table': 'accounts_tiermodelprice',
                        'constraints': [models.UniqueConstraint(fields=('tier', 'deployment'), name='one_price_per_tier_and_deployment')],
                    },
                ),
                migrations.CreateModel(
                    name='UsageRecord',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('generation', 'Generation'), ('moderation', 'Moderation'), ('embedding', 'Embedding'), ('summary', 'Conversation summary'), ('cached', 'Cached answer')], default='generation', max_length=16)),
                        ('status', models.CharField(max_length=16)),
                        ('prompt_tokens', models.PositiveIntegerField(default=0)),
                        ('cached_tokens', models.PositiveIntegerField(default=0, help_text="Of the prompt tokens, those served from the engine's prefix cache (cached price).")),
                        ('completion_tokens', models.PositiveIntegerField(default=0)),
                        ('prompt_price_per_1k', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=12)),
                        ('cached_price_per_1k', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=12)),
                        ('completion_price_per_1k', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=12)),
                        ('cost', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=16)),
                        ('created_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                        ('deployment', models.ForeignKey(help_text='Empty for a moderation request: no model ran.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='usage_records', to='inference.modeldeployment')),
                        ('generation', models.OneToOneField(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='usage_record', to='inference.generation')),
                        ('tier', models.ForeignKey(help_text='Empty: no tier existed.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='usage_records', to='accounts.tier')),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='usage_records', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'accounts_usagerecord',
                        'ordering': ['-created_at'],
                        'indexes': [models.Index(fields=['user', 'created_at'], name='accounts_us_user_id_36c3c1_idx')],
                    },
                ),
            ],
            database_operations=[],
        ),
        content_types_moved("tiermodelprice", "usagerecord", source="accounts", target="billing"),
    ]
