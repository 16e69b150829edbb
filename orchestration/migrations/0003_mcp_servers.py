"""MCP servers an operator adds in the admin, whose tools the chosen tiers may use (orchestration.tools.mcp)."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0015_verified_email'),
        ('orchestration', '0002_summaries_to_conversations'),
    ]

    operations = [
        migrations.CreateModel(
            name='McpServer',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=20, unique=True, validators=[django.core.validators.RegexValidator('^[A-Za-z0-9]{1,20}$', "Letters and digits only, at most 20: it prefixes the names of the server's tools.")])),
                ('transport', models.CharField(choices=[('http', 'Streamable HTTP'), ('stdio', 'stdio (a command on this machine)')], default='http', max_length=8)),
                ('url', models.URLField(blank=True, help_text="Streamable HTTP: the server's endpoint, like https://mcp.example.com/mcp.", max_length=500)),
                ('auth_header', models.CharField(blank=True, default='Authorization', help_text='Streamable HTTP.', max_length=64, validators=[django.core.validators.RegexValidator('^[A-Za-z0-9-]{1,64}$', 'A header name, like Authorization.')])),
                ('auth_env_var', models.CharField(blank=True, help_text='Streamable HTTP: the environment variable holding the header\'s value ("Bearer …"); the value itself is never stored here.', max_length=128, validators=[django.core.validators.RegexValidator('^[A-Z_][A-Z0-9_]{0,127}$', 'The name of an environment variable, like MCP_SEARCH_TOKEN.')])),
                ('command', models.CharField(blank=True, help_text='stdio: the program to start.', max_length=500)),
                ('args', models.JSONField(blank=True, default=list, help_text='stdio: its arguments, a JSON list of strings.')),
                ('enabled', models.BooleanField(default=True)),
                ('timeout_s', models.FloatField(default=30.0, help_text='How long one call may take, connecting included.', validators=[django.core.validators.MinValueValidator(1.0), django.core.validators.MaxValueValidator(600.0)])),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('tiers', models.ManyToManyField(blank=True, help_text='The tiers whose chats may use its tools (none: nobody).', related_name='+', to='accounts.tier')),
            ],
            options={
                'verbose_name': 'MCP server',
                'ordering': ['name'],
            },
        ),
    ]
