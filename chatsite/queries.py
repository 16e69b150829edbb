"""Statements Django's ORM does not write, built from its own compiled queries."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, TypeVar

from django.db import connection, connections, router
from django.db.models import Field, Model, QuerySet
from django.db.models.constants import OnConflict
from django.db.models.sql import InsertQuery, UpdateQuery
from django.utils import timezone

M = TypeVar("M", bound=Model)


def sql_value(model: type[Model], field: str, value: Any) -> Any:
    """`value` as hand-written SQL on the default database passes it for `model`'s `field`: a
    generation's UUID, say, is 32 hex characters on SQLite and a uuid on PostgreSQL."""
    column = model._meta.get_field(field)
    assert isinstance(column, Field)  # a column of the model's own, not a relation seen from its other side
    return column.get_db_prep_value(value, connection)


def sql_now() -> Any:
    """The time now, as hand-written SQL on the default database passes a datetime."""
    return connection.ops.adapt_datetimefield_value(timezone.now())


def update_returning(queryset: QuerySet[M], *, leaving_out: Collection[str] = (), **values: Any) -> list[M]:
    """`queryset.update(**values)` that also returns the rows it changed, in one statement.

    PostgreSQL and SQLite (3.35 and later) both take `UPDATE … RETURNING`. The UPDATE is the one
    Django compiles for `update()`, so values and lookups are converted as they would be there; only
    `RETURNING` is added, and the rows come back as model instances. `leaving_out`: fields not read
    back (a large one no caller needs); they are deferred on the instances, read if used.
    """
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)  # type: ignore[attr-defined]  # UpdateQuery's, after chain()
    query.clear_select_clause()
    statement, params = query.get_compiler(queryset.db).as_sql()
    model = queryset.model
    returning = "*"
    if leaving_out:
        columns = [field.column for field in model._meta.concrete_fields if field.name not in leaving_out]
        returning = ", ".join(f'"{column}"' for column in columns)
    manager = model._default_manager.db_manager(queryset.db)
    return list(manager.raw(f"{statement} RETURNING {returning}", params))


def insert_unless_conflicting(obj: M) -> bool:
    """`obj.save(force_insert=True)` that inserts nothing when a unique constraint already holds a
    row like it, in one statement: `INSERT … ON CONFLICT DO NOTHING RETURNING pk`.

    True when the row went in (and `obj.pk` is set); False when another row already held its place.
    Unlike catching the IntegrityError, it needs no savepoint (two more round trips) to keep the
    caller's transaction usable. The INSERT is the one Django compiles for `bulk_create(...,
    ignore_conflicts=True)`, so values are converted as they would be there. PostgreSQL and SQLite
    (3.35 and later) both take it.
    """
    model = type(obj)
    meta = model._meta
    using = router.db_for_write(model, instance=obj)
    fields = [field for field in meta.local_concrete_fields if not (field is meta.auto_field and obj.pk is None)]
    query = InsertQuery(model, on_conflict=OnConflict.IGNORE)
    query.insert_values(fields, [obj])
    compiler = query.get_compiler(using=using)
    compiler.returning_fields = [meta.pk]
    [(statement, params)] = compiler.as_sql()
    with connections[using].cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    if row is None:
        return False
    obj.pk = row[0]
    obj._state.adding = False
    obj._state.db = using
    return True
