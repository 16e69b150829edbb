"""The migration that made "auto" the default dtype: the default deployment moves, a chosen dtype stays."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME
from inference.models import ModelDeployment

BEFORE = [("inference", "0004_generation_queue_priority")]
AFTER = [("inference", "0005_deployment_dtype_auto")]


@pytest.mark.django_db(transaction=True)
def test_the_default_deployment_moves_to_auto_and_an_operators_choice_stays(latest_schema_after):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("inference", "ModelDeployment")
    old.objects.update_or_create(
        name=DEFAULT_DEPLOYMENT_NAME, defaults={**DEFAULT_DEPLOYMENT_FIELDS, "dtype": "bfloat16"}
    )
    old.objects.create(name="chosen-bf16", model="SmolLM2-135M-Instruct", dtype="bfloat16")
    old.objects.create(name="chosen-fp16", model="SmolLM2-135M-Instruct", dtype="float16")

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)

    # Only the rows this test made: other deployments (the embedding one) may exist beside them.
    named = ModelDeployment.objects.filter(name__in=[DEFAULT_DEPLOYMENT_NAME, "chosen-bf16", "chosen-fp16"])
    dtypes = dict(named.values_list("name", "dtype"))
    assert dtypes == {DEFAULT_DEPLOYMENT_NAME: "auto", "chosen-bf16": "bfloat16", "chosen-fp16": "float16"}


@pytest.mark.django_db(transaction=True)
def test_the_default_deployment_gets_its_tool_parser_and_another_stays_without(latest_schema_after):
    before = [("inference", "0009_deployment_task")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("inference", "ModelDeployment")
    old.objects.update_or_create(name=DEFAULT_DEPLOYMENT_NAME, defaults=DEFAULT_DEPLOYMENT_FIELDS)
    old.objects.create(name="another", model="SmolLM2-135M-Instruct")

    after = [("inference", "0010_deployment_tool_parser")]
    executor = MigrationExecutor(connection)
    executor.migrate(after)

    # The model as that migration left it (later ones add columns this schema has not yet).
    new = executor.loader.project_state(after).apps.get_model("inference", "ModelDeployment")
    parsers = dict(new.objects.values_list("name", "tool_parser"))
    assert (parsers[DEFAULT_DEPLOYMENT_NAME], parsers["another"]) == ("hermes", "")
    assert new.objects.get(name=DEFAULT_DEPLOYMENT_NAME).chat_template == "chatml_hermes_tools.jinja"
