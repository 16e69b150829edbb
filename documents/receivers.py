from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate
from django.dispatch import receiver

from documents.background import embedded_pool
from documents.index import sqlite_connection_prepare
from inference.signals import server_started


@receiver(connection_created)
def sqlite_vec_load(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Every new SQLite connection gets sqlite-vec (documents/index.py); the wrapper remembers whether
    it did, which `vector_backend()` reports."""
    if connection.vendor == "sqlite":
        connection.sqlite_vec_ready = sqlite_connection_prepare(connection.connection)


@receiver(post_migrate)
def sqlite_vec_prepare_after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """A connection opened before the chunk table existed (a fresh database's) gets sqlite-vec's
    table now, instead of at its next connection."""
    from django.db import connections

    wrapper = connections[using]
    if wrapper.vendor == "sqlite" and wrapper.connection is not None and sender.name == "documents":
        wrapper.sqlite_vec_ready = sqlite_connection_prepare(wrapper.connection)  # type: ignore[attr-defined]


@receiver(server_started)
def embedded_pool_start(sender: Any, **kwargs: Any) -> None:
    """In the embedded default, start processing files at start-up, those left from before first."""
    if settings.DOCUMENTS_PROCESSING == "thread":
        embedded_pool()
