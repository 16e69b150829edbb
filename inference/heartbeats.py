"""The heartbeat rows of the processes that run generations in their own event loop (the embedded
default's servers, `ProcessHeartbeat`): a process beats while it serves, and the rows of processes
long silent are removed. Which generations a silent process left is a selector
(`generation_ids_orphaned_locally`); ending them is the execution layer's."""

from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from inference.models import ProcessHeartbeat


def process_heartbeat_beat(*, name: str) -> None:
    """Say that the local process `name` is alive, by the database's clock."""
    if ProcessHeartbeat.objects.filter(name=name).update(seen_at=Now()):
        return
    try:
        with transaction.atomic():
            ProcessHeartbeat.objects.create(name=name, seen_at=Now())
    except IntegrityError:  # its previous beat's row, created meanwhile by a beat that ran late
        ProcessHeartbeat.objects.filter(name=name).update(seen_at=Now())


def process_heartbeats_forget(*, older_than_s: float) -> int:
    """Remove the heartbeats of processes silent this long: one row is left by every server that
    stopped, and once its generations are ended nothing needs it."""
    removed, _ = ProcessHeartbeat.objects.filter(seen_at__lt=Now() - timedelta(seconds=older_than_s)).delete()
    return removed
