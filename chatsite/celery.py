"""The Celery app: GPU workers that host vLLM engines and run generations from queues gpu.<deployment>.

Run a worker with a pool that keeps every task in one process, so all of them share the one engine
(continuous batching across concurrent tasks):

    celery -A chatsite worker -P threads -c 16 -Q gpu.smollm2-135m

The prefork pool cannot work: vLLM starts an engine process, which a daemonic child may not do.
"""

from __future__ import annotations

import logging
import os

from celery import Celery
from celery.signals import celeryd_after_setup, worker_shutdown, worker_shutting_down

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_after_setup.connect
def start_engines(sender, instance, **kwargs) -> None:
    """Warm the engines before the first task arrives: a worker serves the deployments it consumes."""
    from inference.workers import worker_runtime_start

    queues = list(instance.app.amqp.queues.consume_from or {})
    try:
        worker_runtime_start(queues=queues, name=str(sender), pool=instance.pool_cls)
    except RuntimeError as exc:
        # Celery logs and ignores exceptions from signal handlers; a GPU worker that cannot host its
        # engine must not take tasks, so leave for good.
        logging.getLogger(__name__).critical("%s", exc)
        raise SystemExit(1) from exc


@worker_shutting_down.connect
def stop_engines(**kwargs) -> None:
    from inference.workers import worker_runtime_stop

    worker_runtime_stop()


@worker_shutdown.connect
def stop_engines_at_exit(**kwargs) -> None:
    """However the worker stops: an unrecoverable error stops it without worker_shutting_down, and
    its engine process, left running, would keep the process from exiting (Python joins it) while
    the engine loop's heartbeat goes on saying it is ready. Stopping twice is harmless."""
    from inference.workers import worker_runtime_stop

    worker_runtime_stop()
