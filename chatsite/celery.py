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
from celery.signals import celeryd_after_setup, worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The generation task sits with the rest of the execution backends, below the app's top.
app.autodiscover_tasks(["inference.execution"])


@celeryd_after_setup.connect
def start_engines(sender, instance, **kwargs) -> None:
    """Warm the engines before the first task arrives: a worker serves the deployments it consumes."""
    from inference.execution.workers import worker_runtime_start
    from observability.metrics import worker_metrics_serve

    worker_metrics_serve()
    queues = list(instance.app.amqp.queues.consume_from or {})
    if queues and not any(queue.startswith("gpu.") for queue in queues):
        return  # a worker for other queues only (documents) hosts no engine
    try:
        worker_runtime_start(queues=queues, name=str(sender), pool=instance.pool_cls)
    except RuntimeError as exc:
        # Celery logs and ignores exceptions from signal handlers; a GPU worker that cannot host its
        # engine must not take tasks, so leave for good.
        logging.getLogger(__name__).critical("%s", exc)
        raise SystemExit(1) from exc


@worker_shutdown.connect
def stop_engines(**kwargs) -> None:
    """Close the engines once the worker has finished its tasks, however it stops. A warm shutdown
    (SIGTERM) stops taking tasks and lets the running ones end: their answers need the engine, and
    the heartbeat (without which the reaper ends them as lost) until then; `worker_shutting_down`
    comes with the signal, before any of that. An unrecoverable error sends no such signal, and an
    engine process left running would keep the worker from exiting while its heartbeat said ready."""
    from inference.execution.workers import worker_runtime_stop

    worker_runtime_stop()
