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

    dtypes = dict(ModelDeployment.objects.values_list("name", "dtype"))
    assert dtypes == {DEFAULT_DEPLOYMENT_NAME: "auto", "chosen-bf16": "bfloat16", "chosen-fp16": "float16"}
