"""The embedded default's processing of uploaded files: a few threads of the web process, taking
files from a queue that is fair between users.

Each user's waiting files form a line of their own; a free thread takes the next file of the user
who has waited longest and has none in progress, so one user's files (a hundred of them, or one
that takes its whole time limit) hold at most one thread while anyone else's wait. The threads
mostly wait: a file is read in a child process (documents.sandbox), and embedding runs in numpy and
torch, which let go of the interpreter's lock, so chat in the same process goes on beside them.

Files queued or processing when the process stopped are taken up again when it starts
(`EmbeddedPool.resume`, from the server's start-up or the first request, whichever comes first). A
file whose claim finds another run alive on it, or another of its owner's files in progress (left
by the process before, or by another process on the same database), is tried again later.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from django.conf import settings
from django.db import close_old_connections

from documents.models import Document
from documents.services import STALE_PROCESSING, document_process
from documents.tasks import document_process_task

logger = logging.getLogger(__name__)

# When to try again a file whose owner has another in progress, or which another run holds.
BUSY_RETRY_S = 2.0
RUNNING_RETRY_S = STALE_PROCESSING.total_seconds() + 1


class EmbeddedPool:
    """Worker threads and the per-user lines they take files from (see the module's docstring)."""

    def __init__(self, *, workers: int) -> None:
        self._lines: dict[int, deque[int]] = {}  # owner id: their files, oldest first; dict order is the turn
        self._in_progress: set[int] = set()  # owners with a file being processed
        self._changed = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"documents-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def put(self, *, owner_id: int, document_id: int) -> None:
        with self._changed:
            line = self._lines.setdefault(owner_id, deque())
            if document_id not in line:
                line.append(document_id)
            self._changed.notify()

    def put_later(self, *, owner_id: int, document_id: int, delay_s: float) -> None:
        timer = threading.Timer(delay_s, self.put, kwargs={"owner_id": owner_id, "document_id": document_id})
        timer.daemon = True
        timer.start()

    def resume(self) -> None:
        """Queue every file left queued or processing, oldest first (in a thread: it reads the database)."""

        def run() -> None:
            close_old_connections()
            try:
                left = Document.objects.filter(
                    status__in=[Document.Status.QUEUED, Document.Status.PROCESSING]
                ).values_list("owner_id", "id")
                for owner_id, document_id in left.order_by("created_at", "id"):
                    self.put(owner_id=owner_id, document_id=document_id)
            except Exception:
                logger.exception("documents: resuming the files left queued failed")
            finally:
                close_old_connections()

        threading.Thread(target=run, name="documents-resume", daemon=True).start()

    def stop(self) -> None:
        """Let the threads end once their current file is done."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)

    def _take(self) -> tuple[int, int] | None:
        with self._changed:
            while not self._stopping:
                for owner_id, line in self._lines.items():
                    if owner_id in self._in_progress:
                        continue
                    document_id = line.popleft()
                    # The owner goes to the back of the turn, or leaves it with an empty line.
                    del self._lines[owner_id]
                    if line:
                        self._lines[owner_id] = line
                    self._in_progress.add(owner_id)
                    return owner_id, document_id
                self._changed.wait()
            return None

    def _done(self, owner_id: int) -> None:
        with self._changed:
            self._in_progress.discard(owner_id)
            self._changed.notify_all()

    def _work(self) -> None:
        while (taken := self._take()) is not None:
            owner_id, document_id = taken
            outcome = "failed"
            close_old_connections()
            try:
                outcome = document_process(document_id=document_id)
            except Exception:
                logger.exception("document %s: processing failed", document_id)
            finally:
                close_old_connections()
                self._done(owner_id)
            if outcome in ("busy", "running"):
                delay = BUSY_RETRY_S if outcome == "busy" else RUNNING_RETRY_S
                self.put_later(owner_id=owner_id, document_id=document_id, delay_s=delay)


_pool: EmbeddedPool | None = None
_pool_lock = threading.Lock()


def embedded_pool() -> EmbeddedPool:
    """This process's pool, started (and the files left from before resumed) on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = EmbeddedPool(workers=settings.DOCUMENTS_WORKERS)
            _pool.resume()
        return _pool


def document_process_dispatch(*, document_id: int, owner_id: int) -> None:
    """Process the document in the background: a Celery task on the "documents" queue in the
    production topology, the embedded pool of this process otherwise."""
    if settings.DOCUMENTS_PROCESSING == "celery":
        document_process_task.apply_async(args=[document_id], queue="documents")
        return
    embedded_pool().put(owner_id=owner_id, document_id=document_id)
