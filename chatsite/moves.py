"""A model moved from one app to another keeps its table and its rows: the old app's migration drops
it from its state only, the new app's adds it to its own (SeparateDatabaseAndState), and the content
types follow it, so the permissions granted on it stay granted and admin log entries still find it."""

from __future__ import annotations

from django.db import migrations


def content_types_moved(*models: str, source: str, target: str) -> migrations.RunPython:
    """The migration step that relabels the content types of `models` (lower-case names) from app
    `source` to app `target`, and back when the migration is reversed. A database that never had them
    (a fresh one: content types are made after the migrations) has nothing to relabel."""

    def move(apps, from_app: str, to_app: str) -> None:
        content_type = apps.get_model("contenttypes", "ContentType")
        for model in models:
            if not content_type.objects.filter(app_label=to_app, model=model).exists():
                content_type.objects.filter(app_label=from_app, model=model).update(app_label=to_app)

    return migrations.RunPython(
        lambda apps, schema_editor: move(apps, source, target),
        lambda apps, schema_editor: move(apps, target, source),
    )
