from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from django.conf import settings
from django.db.models import Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.utils import timezone

from accounts.models import User
from chatsite.errors import ClientError
from inference.engine.host import EngineSpec
from inference.models import Generation, GenerationId, ModelDeployment, ProcessHeartbeat
from inference.scheduling import queue_order

# How a local process's name (the `worker` of the generations it claims) begins; a Celery worker's
# never does.
LOCAL_WORKER_PREFIX = "local:"


def deployment_list_enabled(*, task: str | None = ModelDeployment.Task.GENERATE) -> list[ModelDeployment]:
    """The enabled deployments serving `task` (None: every task, as /v1/models lists them)."""
    deployments = ModelDeployment.objects.filter(is_enabled=True)
    return list(deployments if task is None else deployments.filter(task=task))


def deployment_get(
    *, name: str | None = None, with_queue_length: bool = False, task: str = ModelDeployment.Task.GENERATE
) -> ModelDeployment:
    """An enabled deployment by name, or the default one; one serving another `task` (an embedding
    model asked to chat) is a 400 naming what it serves.

    `with_queue_length`: with how many of its generations are queued (`queued_now`), counted in the
    same statement, for a send's admission control (`generation_admit`): one round trip fewer on the
    way to its first token."""
    name = name or settings.INFERENCE_DEFAULT_DEPLOYMENT
    deployments = ModelDeployment.objects.all()
    if with_queue_length:
        deployments = deployments.annotate(queued_now=queue_length_annotation())
    try:
        deployment = deployments.get(name=name, is_enabled=True)
    except ModelDeployment.DoesNotExist:
        raise ClientError(
            f"The model '{name}' does not exist.", code="model_not_found", param="model", status=404
        ) from None
    if deployment.task != task:
        raise ClientError(
            f"The model '{name}' serves {deployment.get_task_display().lower()}, not this endpoint.",
            code="model_not_supported",
            param="model",
        )
    return deployment


@dataclass(frozen=True)
class Routed:
    """The deployment chosen to serve one request, and why (recorded on its generation)."""

    deployment: ModelDeployment
    reason: str = ""


class DeploymentRouter(Protocol):
    def __call__(
        self,
        *,
        user: User,
        model: str,
        sticky: ModelDeployment | None = None,
        prompt_tokens: Callable[[ModelDeployment], int] | None = None,
    ) -> Routed: ...


_router: list[DeploymentRouter] = []
# Model names the router serves that no deployment has (`auto`), as /v1/models lists them.
_routed_names: list[str] = []


def deployment_router_install(router: DeploymentRouter, *, names: list[str]) -> None:
    """Install the router that maps public model names to deployments: orchestration's, at start-up
    (its AppConfig.ready), with the names it serves besides the deployments' own (`names`). inference
    is below orchestration, so the OpenAI API reaches it this way."""
    _router[:] = [router]
    _routed_names[:] = names


def models_listed(deployments: list[ModelDeployment]) -> list[tuple[str, ModelDeployment]]:
    """The public model names these deployments serve, in their order, each with the first of its
    deployments (what a list shows of it); the router's own names (`auto`) first, when any chat
    deployment is among them that is not drained."""
    named: dict[str, ModelDeployment] = {}
    for deployment in deployments:
        named.setdefault(deployment.public_model, deployment)
    chat = [d for d in deployments if d.task == ModelDeployment.Task.GENERATE and d.weight > 0]
    routed = [(name, chat[0]) for name in _routed_names if chat and name not in named]
    return [*routed, *named.items()]


def deployment_route(
    *, user: User, model: str, prompt_tokens: Callable[[ModelDeployment], int] | None = None
) -> Routed:
    """The deployment that serves `user`'s request for the public `model` (orchestration.routing);
    `prompt_tokens` measures the request's prompt with a deployment's tokenizer, for `auto`. Without
    a router installed, the enabled deployment of that name, with its queue's length."""
    if _router:
        return _router[0](user=user, model=model, prompt_tokens=prompt_tokens)
    return Routed(deployment_get(name=model, with_queue_length=True))


def deployment_serving(*, model: str) -> ModelDeployment:
    """A deployment serving the public `model` (the heaviest), for what needs its tokenizer before
    the request is routed; the default one for a name no deployment serves (`auto`)."""
    serving = ModelDeployment.objects.filter(is_enabled=True).filter(
        Q(public_name=model) | Q(public_name="", name=model)
    )
    return serving.order_by("-weight", "name").first() or deployment_get()


def generation_writer(generation: Generation) -> str:
    """The deployment that writes a generation (the router's choice), where its row came with it;
    never a query, so async code may ask."""
    return generation.deployment.answer_model if Generation.deployment.is_cached(generation) else ""


def queue_length_annotation() -> RawSQL:
    """How many of the deployment's generations are queued, for a query that reads the deployment's
    row (itself or joined by `select_related`), so that a send's admission control needs no count
    of its own. Written as SQL: the ORM's Subquery(Count) takes about a millisecond longer to
    compile than the round trip it saves."""
    return RawSQL(_QUEUE_LENGTH_SQL, (Generation.Status.QUEUED,))


_QUEUE_LENGTH_SQL = 'SELECT COUNT(*) FROM "{g}" WHERE "{g}"."{fk}" = "{d}"."id" AND "{g}"."status" = %s'.format(
    g=Generation._meta.db_table, fk=Generation._meta.get_field("deployment").column, d=ModelDeployment._meta.db_table
)


def deployment_candidates(*, model: str | None) -> list[ModelDeployment]:
    """The enabled deployments that answer to the public `model` (its `public_name`, or its own name
    where that is empty), every task; with None, every enabled generating one. Heaviest first, each
    with its queue's length (`queued_now`), in one statement.

    Written as SQL: every request for a model reads this, and the ORM took longer compiling the
    query (about 2.5 ms of CPU) than PostgreSQL took answering it."""
    if model is None:
        return list(
            ModelDeployment.objects.raw(_CANDIDATES_SQL_ANY, [Generation.Status.QUEUED, ModelDeployment.Task.GENERATE])
        )
    return list(ModelDeployment.objects.raw(_CANDIDATES_SQL_NAMED, [Generation.Status.QUEUED, model, model]))


def _candidates_sql(where: str) -> str:
    d = ModelDeployment._meta.db_table
    return (
        f'SELECT "{d}".*, ({_QUEUE_LENGTH_SQL}) AS "queued_now" FROM "{d}" WHERE "{d}"."is_enabled" AND ({where}) '
        f'ORDER BY "{d}"."weight" DESC, "{d}"."name" ASC'
    )


_CANDIDATES_SQL_ANY = _candidates_sql('"task" = %s')
_CANDIDATES_SQL_NAMED = _candidates_sql('"public_name" = %s OR ("public_name" = \'\' AND "name" = %s)')


def deployment_get_cached(*, deployment_id: int) -> ModelDeployment:
    """A deployment by id, read once per process: for a worker, whose engines were built from
    these rows when it started, so an edit reaches them only with a restart anyway."""
    deployment = _deployments.get(deployment_id)
    if deployment is None:
        deployment = _deployments[deployment_id] = ModelDeployment.objects.get(id=deployment_id)
    return deployment


def deployment_cached(*, deployment_id: int) -> ModelDeployment | None:
    """The deployment if this process has read it already (`deployment_get_cached`); no query."""
    return _deployments.get(deployment_id)


def deployment_cache_clear() -> None:
    """Forget the deployments this process has read (`deployment_get_cached`). A process in service
    never needs it: ids are never reused there. A test's rollback reuses them, so the tests clear it."""
    _deployments.clear()


_deployments: dict[int, ModelDeployment] = {}


def engine_spec_for(deployment: ModelDeployment) -> EngineSpec:
    return EngineSpec(
        name=deployment.name,
        model_path=deployment.model_path,
        max_context=deployment.max_context,
        engine=deployment.engine_kind,
        tokens_per_s=settings.INFERENCE_SCRIPTED_TOKENS_PER_S,
        tensor_parallel_size=deployment.tensor_parallel_size,
        dtype=deployment.dtype,
        enforce_eager=settings.INFERENCE_ENFORCE_EAGER,
        cpu_scheduler_spin_ms=settings.INFERENCE_CPU_SCHEDULER_SPIN_MS,
        cpu_worker_spin_ms=settings.INFERENCE_CPU_WORKER_SPIN_MS,
        extra_args=dict(deployment.engine_args or {}),
    )


def generation_get_for_user(*, generation_id, user) -> Generation | None:
    return Generation.objects.select_related("deployment").filter(id=generation_id, user=user).first()


def generation_ids_stop_requested(*, ids: list[str]) -> list[str]:
    """Those of these generations someone has asked to stop."""
    return [str(i) for i in Generation.objects.filter(id__in=ids, stop_requested=True).values_list("id", flat=True)]


def generation_queued_count(*, deployment: ModelDeployment) -> int:
    return Generation.objects.filter(deployment=deployment, status=Generation.Status.QUEUED).count()


def generation_queue_ordered(*, deployment: ModelDeployment, limit: int = 100) -> list[Generation]:
    """The deployment's queued generations in the order they should run (see inference.scheduling)."""
    queued = Generation.objects.filter(deployment=deployment, status=Generation.Status.QUEUED).only(
        "id", "priority", "created_at", "user_id", "deployment_id"
    )
    return queue_order(queued, now=timezone.now(), aging_s=settings.INFERENCE_PRIORITY_AGING_S)[:limit]


def generation_tokens_reserved_for_user(*, user) -> int:
    """Tokens the user's unfinished generations may still use: prompt plus the answer's max_tokens.
    Titles and summaries are not charged (accounts.services.usage_record), so they reserve nothing."""
    rows = (
        Generation.objects.filter(user_id=user.id, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING])
        .exclude(purpose__in=[Generation.Purpose.TITLE, Generation.Purpose.SUMMARY])
        .values_list("prompt_tokens", "sampling")
    )
    return sum(prompt + int((sampling or {}).get("max_tokens") or 0) for prompt, sampling in rows)


def generation_awaiting_verdict(*, generation_id: GenerationId) -> bool | None:
    """Whether a held generation still waits for its message's verdict; None when its row is gone
    (withdrawn)."""
    return Generation.objects.filter(id=generation_id).values_list("awaiting_verdict", flat=True).first()


def generations_finished(*, ids: list[str]) -> list[Generation]:
    """Those of these generations whose rows say they have ended."""
    return list(Generation.objects.filter(id__in=ids, status__in=Generation.FINISHED))


def generation_ids_orphaned_locally(*, own: str) -> list[GenerationId]:
    """Generations still running on a local process (not `own`) that has gone silent: its heartbeat
    is older than INFERENCE_WORKER_HEARTBEAT_TTL_S by the database's clock, or missing."""
    alive = ProcessHeartbeat.objects.filter(
        seen_at__gte=Now() - timedelta(seconds=settings.INFERENCE_WORKER_HEARTBEAT_TTL_S)
    ).values("name")
    return list(
        Generation.objects.filter(status=Generation.Status.RUNNING, worker__startswith=LOCAL_WORKER_PREFIX)
        .exclude(worker=own)
        .exclude(worker__in=alive)
        .values_list("id", flat=True)
    )
