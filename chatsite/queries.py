"""Statements Django's ORM does not write, built from its own querysets."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from django.db.models.sql import UpdateQuery

M = TypeVar("M", bound=Model)


def update_returning(queryset: QuerySet[M], **values: Any) -> list[M]:
    """`queryset.update(**values)` that also returns the rows it changed, in one statement.

    PostgreSQL and SQLite (3.35 and later) both take `UPDATE … RETURNING`. The UPDATE is the one
    Django compiles for `update()`, so values and lookups are converted as they would be there; only
    `RETURNING *` is added, and the rows come back as model instances.
    """
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)
    query.clear_select_clause()
    statement, params = query.get_compiler(queryset.db).as_sql()
    manager = queryset.model._default_manager.db_manager(queryset.db)
    return list(manager.raw(f"{statement} RETURNING *", params))
