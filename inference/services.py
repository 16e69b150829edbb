from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import User
from chatsite.errors import ClientError
from chatsite.parsers import JsonObject
from chatsite.queries import update_returning
from inference.backend import generation_abort, generation_dispatch
from inference.caching import CachedAnswer
from inference.engine.base import PromptImage
from inference.models import Generation, GenerationId, GenerationImage, ModelDeployment
from inference.scheduling import effective_priority
from inference.selectors import deployment_get_cached, generation_queued_count
from inference.signals import generation_finished, generation_started

logger = logging.getLogger(__name__)


def generation_admit(*, deployment: ModelDeployment) -> None:
    """Admission control: refuse new work before it is queued when the deployment's queue is full.

    The bound is checked, not reserved: sends racing each other can overshoot it by at most the
    number of sends in flight at that instant, which keeps this a single cheap count. A deployment
    read with it (`deployment_get(with_queue_length=True)`, `conversation_get_for_send`) carries
    that count already (`queued_now`), and no statement is spent on it here.
    """
    queued = getattr(deployment, "queued_now", None)
    if queued is None:
        queued = generation_queued_count(deployment=deployment)
    if queued >= deployment.max_queued:
        raise ClientError(
            f"The model '{deployment.name}' is at capacity right now. Try again in a moment.",
            code="at_capacity",
            status=503,
            retry_after=settings.INFERENCE_AT_CAPACITY_RETRY_S,
        )


def generation_create(
    *,
    user: User,
    deployment: ModelDeployment,
    prompt_token_ids: list[int],
    sampling: JsonObject,
    priority: int = 0,
    awaiting_verdict: bool = False,
    tier_id: int | None = None,
    purpose: str = Generation.Purpose.ANSWER,
    routing_reason: str = "",
    cached: CachedAnswer | None = None,
    images: Sequence[PromptImage] = (),
    tool_fields: JsonObject | None = None,
) -> Generation:
    """A queued generation; dispatched to an engine once the caller's transaction commits.

    `images`: what a vision deployment's prompt shows, in the order of its image placeholders, each
    already cleaned by the service (documents.imaging); kept beside the row for the worker to read.

    `awaiting_verdict`: hold its text until input moderation's verdict on its message is in. It is
    dispatched all the same, so the engine computes the answer while the message is scored; the
    runner shows none of it until `generation_release`, and a verdict that blocks takes it back with
    `generation_withdraw`. Set on the row's INSERT: no statement of its own before the dispatch.

    `tier_id`: the user's tier as the caller read it for this request (its limits). It goes to the
    engine with the order, and the answer's output moderation runs under that tier's policy: the
    same tier its message's input check used, and no read of the user's tier in the worker.

    `cached`: an earlier answer from the response cache (inference.caching), which the runner plays
    back instead of asking the engine: the rest of the answer's path is the same.

    `tool_fields`: a step of an answer's tool loop keeps its request's tool fields, so that any
    follower of its stream can read its calls out of it (inference.openai.tools.tool_call_reader_for)."""
    generation = Generation.objects.create(
        user=user,
        deployment=deployment,
        prompt_token_ids=prompt_token_ids,
        sampling=sampling,
        priority=priority,
        queue_priority=priority,
        prompt_tokens=len(prompt_token_ids),
        awaiting_verdict=awaiting_verdict,
        purpose=purpose,
        routing_reason=routing_reason[:300],
        cached=cached is not None,
        text=cached.text if cached is not None else "",
        completion_tokens=cached.completion_tokens if cached is not None else 0,
        image_count=len(images),
        tool_fields=tool_fields or {},
    )
    if images:
        GenerationImage.objects.bulk_create(
            GenerationImage(generation=generation, ordinal=i, content_type=image.content_type, data=image.data)
            for i, image in enumerate(images)
        )
    order = generation_order(generation, tier_id=tier_id)
    transaction.on_commit(
        lambda: generation_dispatch(
            generation_id=generation.id, queue=deployment.queue_name, priority=priority, order=order
        )
    )
    return generation


# The lowest of the broker's ten steps: what the service asks for itself never goes ahead of anyone's
# answer (aging still moves it on, inference.scheduling).
SERVICE_PRIORITY = 9


def service_generation_create(
    *,
    user: User,
    deployment: ModelDeployment,
    prompt_token_ids: list[int],
    purpose: str,
    temperature: float,
    max_tokens: int,
    structured_outputs: JsonObject | None = None,
) -> Generation:
    """A generation the service asks for itself on `user`'s conversation (a title, a summary):
    `purpose` says which, so it is not charged as an answer; it comes after every answer in the
    queue (SERVICE_PRIORITY); it samples with the deployment's nucleus and repetition settings at the
    caller's temperature and length. `structured_outputs`: vLLM's StructuredOutputsParams fields (as
    JSON), the shape its text must take, as the OpenAI API's `response_format` asks for one."""
    sampling: JsonObject = {
        "temperature": temperature,
        "top_p": deployment.top_p,
        "repetition_penalty": deployment.repetition_penalty,
        "max_tokens": max_tokens,
    }
    if structured_outputs is not None:
        sampling["structured_outputs"] = structured_outputs
    return generation_create(
        user=user,
        deployment=deployment,
        prompt_token_ids=prompt_token_ids,
        sampling=sampling,
        priority=SERVICE_PRIORITY,
        purpose=purpose,
    )


def generation_order(generation: Generation, *, tier_id: int | None = None) -> JsonObject:
    """What an engine needs to start a queued generation, sent with its first dispatch.

    With it the runner starts the engine request at once and claims the row beside the engine's first
    step, instead of before it (Runner.run): the claim still decides who runs the generation, and no
    text is shown before it. Only fields that never change once the row is written are in it, and the
    tier the request was admitted under (`generation_create`), whose policy moderates the answer."""
    order = {
        "tier_id": tier_id,
        "prompt_token_ids": generation.prompt_token_ids,
        "sampling": generation.sampling,
        "priority": generation.priority,
        "deployment_id": generation.deployment_id,
        "user_id": generation.user_id,
        "awaiting_verdict": generation.awaiting_verdict,
    }
    if generation.cached:
        order["cached"] = {"text": generation.text, "completion_tokens": generation.completion_tokens}
    if generation.image_count:
        order["image_count"] = generation.image_count
    return order


def generation_from_order(*, generation_id: GenerationId, order: JsonObject) -> Generation:
    """The generation an order describes, unsaved and unclaimed: enough to start its engine request.
    Its `deployment` is for the caller to set (from the process's cache: no query here)."""
    return Generation(
        id=generation_id,
        user_id=order["user_id"],
        deployment_id=order["deployment_id"],
        prompt_token_ids=list(order["prompt_token_ids"]),
        sampling=dict(order["sampling"]),
        priority=int(order["priority"]),
        prompt_tokens=len(order["prompt_token_ids"]),
        awaiting_verdict=bool(order["awaiting_verdict"]),
        cached="cached" in order,
        text=order["cached"]["text"] if "cached" in order else "",
        completion_tokens=order["cached"]["completion_tokens"] if "cached" in order else 0,
        image_count=int(order.get("image_count") or 0),
    )


def generation_images(*, generation_id: GenerationId) -> list[bytes]:
    """The images a generation's prompt shows its engine, in order."""
    return [
        bytes(data)
        for data in GenerationImage.objects.filter(generation_id=generation_id).values_list("data", flat=True)
    ]


def generation_claim(*, generation_id: GenerationId, worker: str, again: bool = False) -> Generation | None:
    """Move a queued generation to running for `worker`; None when someone else already has it.

    The conditional update is the lock: of two deliveries of the same task only one claims it. One
    statement (`UPDATE … RETURNING`) and no transaction, as it sits between a message and its first
    token; the deployment comes from the process's cache.

    `again`: this is `worker`'s retry of a claim whose connection failed, and the first try may have
    committed before the reply was lost; a row already running for `worker` is then its own claim.
    (A worker's name includes its process id, and a runner runs a generation once at a time.)
    """
    claimable = Q(status=Generation.Status.QUEUED)
    if again:
        claimable |= Q(status=Generation.Status.RUNNING, worker=worker)
    claimed = update_returning(
        Generation.objects.filter(claimable, id=generation_id, stop_requested=False),
        status=Generation.Status.RUNNING,
        worker=worker,
        started_at=timezone.now(),
    )
    if not claimed:
        return None
    generation = claimed[0]
    generation.deployment = deployment_get_cached(deployment_id=generation.deployment_id)
    return generation


@transaction.atomic
def generation_mark_started(*, generation: Generation) -> None:
    """Tell the rest of the site a claimed generation is running (its message shows as streaming).

    The runner calls it once the engine request is under way, off the path to the first token."""
    generation_started.send(sender=Generation, generation=generation)


@transaction.atomic
def generation_finish(
    *,
    generation_id: GenerationId,
    status: str,
    text: str,
    finish_reason: str = "",
    prompt_tokens: int | None = None,
    completion_tokens: int = 0,
    cached_tokens: int = 0,
    error_code: str = "",
    error_message: str = "",
    again: bool = False,
) -> Generation | None:
    """Record a generation's end once. Returns None when it had already ended (a late duplicate).

    `again`: a retry of a finish whose connection failed, which may have committed before the reply
    was lost. A row that ended exactly as this call would end it is then returned (its receivers ran
    in that commit, and run no more), so its caller still announces the end."""
    assert status in Generation.FINISHED
    fields: dict[str, object] = {
        "status": status,
        "text": text,
        "finish_reason": finish_reason,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "error_code": error_code,
        "error_message": error_message[:500],
        "finished_at": timezone.now(),
    }
    if prompt_tokens is not None:
        fields["prompt_tokens"] = prompt_tokens
    # The row comes back from the update itself: what the finish's receivers read is the row's own
    # (ids included), with no second read on the way from an answer's last token to its `done`.
    finished = update_returning(
        Generation.objects.filter(id=generation_id, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]),
        # The prompt's token ids (thousands of them in a long conversation) are not read back: what
        # follows the end has no use for them.
        leaving_out=("prompt_token_ids",),
        **fields,
    )
    if not finished:
        if again:
            same = {f: v for f, v in fields.items() if f not in ("finished_at", "text")}
            return Generation.objects.filter(id=generation_id, **same).first()
        return None
    generation_finished.send(sender=Generation, generation=finished[0])
    return finished[0]


def generation_request_stop(*, generation: Generation) -> Generation | None:
    """Ask for a generation to stop: in the engine if it runs, before it starts if it is queued.

    Returns the generation when this call ended it (it was still queued), so the caller can tell its
    followers; None when an engine will end it (or it had already ended).
    """
    if generation.is_finished:
        return None
    Generation.objects.filter(id=generation.id).update(stop_requested=True)
    ended = None
    if generation.status == Generation.Status.QUEUED:
        # Not claimed yet: end it here. If a worker claims it in between, the claim sees
        # stop_requested and refuses, and this is the end that counts.
        ended = generation_finish(
            generation_id=generation.id, status=Generation.Status.STOPPED, text="", finish_reason="abort"
        )
    generation_abort(generation_id=generation.id)
    return ended


def generations_request_stop(*, generation_ids: Sequence[GenerationId]) -> None:
    """Ask each of these generations to stop (those already ended stay as they are)."""
    for generation in Generation.objects.filter(id__in=generation_ids):
        generation_request_stop(generation=generation)


def user_generations_stop(*, user_id: int) -> list[Generation]:
    """Stop everything an account has queued or running: it was deactivated (accounts'
    `user_deactivated`). Returns those this ended itself (not begun yet), for the caller to announce
    to their followers, as no runner will; a running one's engine announces its own end."""
    unfinished = Generation.objects.filter(
        user_id=user_id, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]
    )
    return [g for g in (generation_request_stop(generation=g) for g in unfinished) if g is not None]


def generation_promote_waiting(*, now: datetime | None = None) -> list[tuple[uuid.UUID, int]]:
    """Apply queue aging to generations waiting in the broker (see inference.scheduling).

    Broker priorities alone are strict: a steady stream of paid work would keep a free request
    waiting forever. A queued generation whose effective priority has improved since its task was
    sent gets its task sent again at the better priority. The older copy stays behind in its lower
    list; whichever is taken first claims the generation and the other finds it claimed. Returns
    (id, new priority) for each promotion.
    """
    aging_s = settings.INFERENCE_PRIORITY_AGING_S
    if aging_s <= 0:
        return []
    now = now or timezone.now()
    promoted = []
    waiting = Generation.objects.filter(status=Generation.Status.QUEUED, queue_priority__gt=0).select_related(
        "deployment"
    )
    for generation in waiting.only("id", "priority", "queue_priority", "created_at", "deployment__name"):
        waited_s = (now - generation.created_at).total_seconds()
        target = max(0, effective_priority(priority=generation.priority, waited_s=waited_s, aging_s=aging_s))
        if target >= (generation.queue_priority or 0):
            continue
        # Conditional: of several processes running this, one promotes each step.
        if Generation.objects.filter(
            id=generation.id, status=Generation.Status.QUEUED, queue_priority=generation.queue_priority
        ).update(queue_priority=target):
            generation_dispatch(generation_id=generation.id, queue=generation.deployment.queue_name, priority=target)
            promoted.append((generation.id, target))
    return promoted


def generations_redispatch_queued(*, before: datetime) -> list[uuid.UUID]:
    """Send again the task of every generation still queued that was queued before `before`: for a
    broker that lost its queues (a Redis restarted without persistence), or never got the task (it
    was down at the dispatch). A task that survived after all is harmless: whichever copy comes
    first claims the generation, and the other finds it claimed. Returns the ids sent."""
    queued = Generation.objects.filter(status=Generation.Status.QUEUED, created_at__lt=before).select_related(
        "deployment"
    )
    sent = []
    for generation in queued.only("id", "queue_priority", "deployment__name"):
        generation_dispatch(
            generation_id=generation.id, queue=generation.deployment.queue_name, priority=generation.queue_priority or 0
        )
        sent.append(generation.id)
    return sent
