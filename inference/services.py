from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from accounts.models import ApiKey, User
from accounts.services import RequestLimits
from chatsite.errors import ClientError
from chatsite.queries import update_returning
from inference.caching import CachedAnswer, response_cache_probe
from inference.held import HeldAnswer
from inference.models import Generation, GenerationId, ModelDeployment, ProcessHeartbeat
from inference.signals import generation_finished, generation_started
from moderation.services import InputCheck, Verdict

logger = logging.getLogger(__name__)


def generation_admit(*, deployment: ModelDeployment) -> None:
    """Admission control: refuse new work before it is queued when the deployment's queue is full.

    The bound is checked, not reserved: sends racing each other can overshoot it by at most the
    number of sends in flight at that instant, which keeps this a single cheap count. A deployment
    read with it (`deployment_get(with_queue_length=True)`, `conversation_get_for_send`) carries
    that count already (`queued_now`), and no statement is spent on it here.
    """
    from inference.selectors import generation_queued_count

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
    sampling: dict[str, Any],
    priority: int = 0,
    awaiting_verdict: bool = False,
    tier_id: int | None = None,
    purpose: str = Generation.Purpose.ANSWER,
    routing_reason: str = "",
    cached: CachedAnswer | None = None,
) -> Generation:
    """A queued generation; dispatched to an engine once the caller's transaction commits.

    `awaiting_verdict`: hold its text until input moderation's verdict on its message is in. It is
    dispatched all the same, so the engine computes the answer while the message is scored; the
    runner shows none of it until `generation_release`, and a verdict that blocks takes it back with
    `generation_withdraw`. Set on the row's INSERT: no statement of its own before the dispatch.

    `tier_id`: the user's tier as the caller read it for this request (its limits). It goes to the
    engine with the order, and the answer's output moderation runs under that tier's policy: the
    same tier its message's input check used, and no read of the user's tier in the worker.

    `cached`: an earlier answer from the response cache (inference.caching), which the runner plays
    back instead of asking the engine: the rest of the answer's path is the same."""
    from inference.execution.dispatch import generation_dispatch

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
    )
    order = generation_order(generation, tier_id=tier_id)
    transaction.on_commit(
        lambda: generation_dispatch(
            generation_id=generation.id, queue=deployment.queue_name, priority=priority, order=order
        )
    )
    return generation


# The lowest of the broker's ten steps: what the service asks for itself never goes ahead of anyone's
# answer (aging still moves it on, inference.execution.scheduling).
SERVICE_PRIORITY = 9


def service_generation_create(
    *,
    user: User,
    deployment: ModelDeployment,
    prompt_token_ids: list[int],
    purpose: str,
    temperature: float,
    max_tokens: int,
) -> Generation:
    """A generation the service asks for itself on `user`'s conversation (a title, a summary):
    `purpose` says which, so it is not charged as an answer; it comes after every answer in the
    queue (SERVICE_PRIORITY); it samples with the deployment's nucleus and repetition settings at the
    caller's temperature and length."""
    return generation_create(
        user=user,
        deployment=deployment,
        prompt_token_ids=prompt_token_ids,
        sampling={
            "temperature": temperature,
            "top_p": deployment.top_p,
            "repetition_penalty": deployment.repetition_penalty,
            "max_tokens": max_tokens,
        },
        priority=SERVICE_PRIORITY,
        purpose=purpose,
    )


def generation_order(generation: Generation, *, tier_id: int | None = None) -> dict[str, Any]:
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
    return order


def generation_from_order(*, generation_id: GenerationId, order: dict[str, Any]) -> Generation:
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
    )


def generation_claim(*, generation_id: GenerationId, worker: str, again: bool = False) -> Generation | None:
    """Move a queued generation to running for `worker`; None when someone else already has it.

    The conditional update is the lock: of two deliveries of the same task only one claims it. One
    statement (`UPDATE … RETURNING`) and no transaction, as it sits between a message and its first
    token; the deployment comes from the process's cache.

    `again`: this is `worker`'s retry of a claim whose connection failed, and the first try may have
    committed before the reply was lost; a row already running for `worker` is then its own claim.
    (A worker's name includes its process id, and a runner runs a generation once at a time.)
    """
    from inference.selectors import deployment_get_cached

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
    fields: dict[str, Any] = {
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
    from inference.execution.dispatch import generation_abort

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


def generations_request_stop(*, generation_ids: list[Any]) -> None:
    """Ask each of these generations to stop (those already ended stay as they are)."""
    for generation in Generation.objects.filter(id__in=generation_ids):
        generation_request_stop(generation=generation)


def user_generations_stop(*, user_id: int) -> list[Generation]:
    """Stop everything an account has queued or running: it was deactivated (accounts'
    `user_deactivated`). Those this ends itself (not begun yet) are announced to their followers
    here, as no runner will; a running one's engine announces its own end. Returns those."""
    from inference.openai import wire
    from inference.streaming.streams import StreamPublisher

    unfinished = Generation.objects.filter(
        user_id=user_id, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]
    )
    ended = [g for g in (generation_request_stop(generation=g) for g in unfinished) if g is not None]

    async def announce() -> None:
        for generation in ended:
            publisher = await StreamPublisher.continuing(generation.id)
            usage = wire.usage(generation.prompt_tokens, generation.completion_tokens, generation.cached_tokens)
            await publisher.finish(status=generation.status, finish_reason=generation.finish_reason, usage=usage)

    if ended:
        async_to_sync(announce)()
    return ended


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


def newest_user_text(request: dict[str, Any]) -> str:
    """What input moderation judges in a chat completion: its newest user message and the tool
    results after it, the turn's new input from the client's tools. A conversation with no user
    message (a system prompt alone, which vLLM answers too) is judged whole: its text is all the
    input there is."""
    texts: list[str] = []
    for message in reversed(request["messages"]):
        if message["role"] == "user":
            return "\n\n".join([message["content"], *reversed(texts)])
        if message["role"] == "tool":
            texts.append(message["content"])
    return "\n\n".join(m["content"] for m in request["messages"] if m["content"])


def completion_create(
    *,
    user: User,
    api_key: ApiKey | None,
    request: dict[str, Any],
    verdict: Verdict | InputCheck | None = None,
    settle: bool = True,
) -> list[Generation] | _HeldCompletion:
    """Moderate the newest user message and queue the completion (see _completion_queue).

    `verdict` is input moderation's verdict on `newest_user_text(request)`, or an `InputCheck`
    whose verdict is taken under the tier the transaction reads (the API view makes one, which
    scores the text after the commit, the generations held meanwhile); without one, the text is
    classified before the transaction opens, so no lock is held while the classifier runs. A
    blocked request is refused with 400 `content_policy_violation`: nothing stays queued, and
    nothing is shown or charged (generations committed held while the scores were coming are
    withdrawn). `settle=False` returns a completion committed held as it is, for an async caller to
    settle once its scores are in (`checked_after_commit`, as for `message_send`).
    """
    from moderation.services import input_moderate

    if verdict is None:
        verdict = input_moderate(user=user, text=newest_user_text(request))
    queued = _completion_queue(user=user, api_key=api_key, request=request, verdict=verdict)
    if isinstance(queued, _HeldCompletion) and settle:
        return queued.settle(cast(InputCheck, verdict))  # only a check's scores still coming hold it
    return queued


@dataclass(frozen=True)
class _HeldCompletion(HeldAnswer[list[Generation]]):
    """A completion's generations committed held (inference.held): passed, they are released;
    blocked, they are withdrawn unseen and uncharged, and the request is refused as it would have
    been had the verdict come first."""

    def passed(self, verdict: Verdict) -> list[Generation]:
        return list(self.generations)

    def blocked(self, verdict: Verdict, *, withdrawn: bool) -> list[Generation]:
        raise ClientError(verdict.explanation(), code="content_policy_violation", param="messages")


@transaction.atomic
def _completion_queue(
    *, user: User, api_key: ApiKey | None, request: dict[str, Any], verdict: Verdict | InputCheck
) -> list[Generation] | _HeldCompletion:
    """Queue the generations of one OpenAI chat completion (`n` of them), after every check.

    The client owns the whole conversation here, system prompt included, so nothing is dropped to
    fit: a prompt that does not fit the window (with the answer asked for) is refused, as OpenAI does.
    The same gate as the chat page applies: the plan's models, limits, quotas and the queue bound.
    The input check's verdict is taken once the prompt is rendered, which does not depend on it; if
    its scores are still coming then, the generations are queued held and the verdict is taken after
    the commit (`inference.held`), as a chat message's is. A request that is both refused
    and blocked is refused as blocked.
    """
    from accounts.services import request_limits, request_size_check
    from inference.engine.tokenizers import tokenizer_for
    from inference.openai.tools import tools_check
    from inference.selectors import deployment_route
    from moderation.services import verdict_under_tier

    prompts: dict[int, list[int]] = {}  # by deployment: `auto` measures the prompt on each it weighs

    def prompt_tokens(deployment: ModelDeployment) -> int:
        # Past the size check's bound a prompt is not tokenized at all: it fits no window of this one.
        if _prompt_chars(request) > deployment.max_context * settings.PROMPT_MAX_CHARS_PER_TOKEN:
            return deployment.max_context * settings.PROMPT_MAX_CHARS_PER_TOKEN
        return len(prompt_on(deployment))

    def prompt_on(deployment: ModelDeployment) -> list[int]:
        if deployment.pk not in prompts:
            tokenizer = tokenizer_for(deployment.model_path)
            prompts[deployment.pk] = _prompt_ids(tokenizer, request, deployment=deployment)
        return prompts[deployment.pk]

    # orchestration.routing: 404 model_not_found, 403 model_not_allowed, 503 when none can take it.
    routed = deployment_route(user=user, model=request["model"], prompt_tokens=prompt_tokens)
    deployment = routed.deployment
    tools_check(request, deployment=deployment)
    limits = request_limits(user=user, deployment=deployment, api_key=api_key)
    # Before the prompt is tokenized or its verdict asked for (which starts the scoring).
    request_size_check(chars=_prompt_chars(request), limits=limits)
    tokenizer = tokenizer_for(deployment.model_path)
    prompt = prompt_on(deployment)
    pending, taken = None, None
    if isinstance(verdict, InputCheck):
        pending, taken = verdict, verdict.verdict_if_scored(tier_id=limits.tier.id)
    else:
        taken = verdict_under_tier(verdict, tier_id=limits.tier.id)
    if taken is not None and taken.blocks:
        raise ClientError(taken.explanation(), code="content_policy_violation", param="messages")
    try:
        generations, admissions = _completion_generations(
            user=user,
            api_key=api_key,
            request=request,
            deployment=deployment,
            limits=limits,
            prompt=prompt,
            tokenizer=tokenizer,
            awaiting_verdict=taken is None,
            routing_reason=routed.reason,
        )
    except ClientError:
        if taken is None and pending is not None:
            taken = pending.verdict(tier_id=limits.tier.id)
        if taken is not None and taken.blocks:
            raise ClientError(taken.explanation(), code="content_policy_violation", param="messages") from None
        raise
    if taken is not None:
        return generations
    # No app recovers a held completion for a runner's last resort (its client went with its web
    # process): `text` is what was judged, for the record.
    text = newest_user_text(request) if "messages" in request else request["prompt"]
    return _HeldCompletion(
        user=user,
        text=text if isinstance(text, str) else "",
        generations=generations,
        admissions=admissions,
        tier_id=limits.tier.id,
    )


def _prompt_chars(request: dict[str, Any]) -> int:
    if "prompt" in request:  # a text completion (/v1/completions): its prompt is text or token ids
        return len(request["prompt"])
    calls = (c["function"]["arguments"] for m in request["messages"] for c in m.get("tool_calls") or ())
    return sum(len(m["content"] or "") for m in request["messages"]) + sum(len(a) for a in calls)


def _prompt_ids(tokenizer: Any, request: dict[str, Any], *, deployment: ModelDeployment) -> list[int]:
    """The prompt's token ids: a chat's messages (and tools) in the deployment's chat template; a
    text completion's prompt as it is (its client owns the whole text, special tokens included, as
    with vLLM), or its token ids, which must be the model's."""
    from inference.engine.tokenizers import render_chat
    from inference.openai.tools import tools_in_prompt

    if "prompt" not in request:
        return render_chat(
            tokenizer, request["messages"], tools=tools_in_prompt(request), chat_template=deployment.chat_template
        )
    prompt = request["prompt"]
    if isinstance(prompt, str):
        return tokenizer(prompt)["input_ids"]
    if any(token >= len(tokenizer) for token in prompt):
        raise ClientError(
            f"Token ids must be below {len(tokenizer)}, the model's vocabulary.", code="invalid_value", param="prompt"
        )
    return list(prompt)


def _completion_generations(
    *,
    user: User,
    api_key: ApiKey | None,
    request: dict[str, Any],
    deployment: ModelDeployment,
    limits: RequestLimits,
    prompt: list[int],
    tokenizer: Any,
    awaiting_verdict: bool,
    routing_reason: str = "",
) -> tuple[list[Generation], list[Any]]:
    """The checks a completion's prompt must pass, then its `n` generations queued and charged (held
    until the verdict is in, with `awaiting_verdict`).

    Without `max_tokens`, the answer may use the rest of the window, within the plan's output cap,
    as OpenAI and vLLM allow (the chat page's shorter default budget is for people, not clients)."""
    from accounts.services import request_admit
    from inference.openai.fields import choice_seed, completion_sampling, token_ids_check
    from inference.openai.tools import tool_sampling

    asked = request.get("max_completion_tokens") or request.get("max_tokens")
    needed = len(prompt) + (asked or settings.INFERENCE_MIN_OUTPUT_TOKENS)
    if needed > limits.max_context:
        _tools_fit_check(
            request,
            prompt=prompt,
            answer=needed - len(prompt),
            tokenizer=tokenizer,
            deployment=deployment,
            limits=limits,
        )
        raise ClientError(
            f"This model's maximum context length is {limits.max_context} tokens. However, you requested {needed} "
            f"tokens ({len(prompt)} in the messages, {needed - len(prompt)} in the completion). "
            "Please reduce the length of the messages or completion.",
            code="context_length_exceeded",
            param="max_tokens" if asked and len(prompt) < limits.max_context else "messages",
        )
    max_tokens = asked or min(limits.output_cap, limits.max_context - len(prompt))
    token_ids_check(request, vocab_size=len(tokenizer), max_tokens=max_tokens)
    generation_admit(deployment=deployment)
    sampling = completion_sampling(request=request, deployment=deployment)
    if "messages" in request:
        sampling.update(tool_sampling(request, deployment=deployment))
    generations, admissions = [], []
    for i in range(request.get("n", 1)):
        seed = choice_seed(request.get("seed"), i)
        admission = request_admit(
            user=user,
            api_key=api_key,
            deployment=deployment,
            prompt_tokens=len(prompt),
            max_tokens=max_tokens,
            limits=limits,
        )
        choice_sampling = {**sampling, "max_tokens": admission.max_tokens, **({} if seed is None else {"seed": seed})}
        cache = _cache_probe(user=user, request=request, deployment=deployment, sampling=choice_sampling)
        generations.append(
            generation_create(
                user=user,
                deployment=deployment,
                prompt_token_ids=prompt,
                sampling=choice_sampling,
                priority=admission.priority,
                awaiting_verdict=awaiting_verdict,
                tier_id=limits.tier.id,
                routing_reason=routing_reason,
                cached=cache.hit if cache is not None else None,
            )
        )
        if cache is not None:
            cache.keep(generation_id=generations[-1].id)
        admissions.append(admission)
    return generations, admissions


def _tools_fit_check(
    request: dict[str, Any],
    *,
    prompt: list[int],
    answer: int,
    tokenizer: Any,
    deployment: ModelDeployment,
    limits: RequestLimits,
) -> None:
    """A prompt over the window because of its tools is refused in words a person can act on: a
    frontend that attaches its tools to every message (Open WebUI sends dozens) fails every
    question, however short, and the person must learn that the tools, not the question, are the
    cause. Passes when there are no tools, or when the messages alone do not fit either."""
    from inference.engine.tokenizers import render_chat
    from inference.openai.tools import tools_in_prompt

    tools = tools_in_prompt(request) if "messages" in request else None
    if not tools:
        return
    without = len(render_chat(tokenizer, request["messages"], chat_template=deployment.chat_template))
    if without + answer > limits.max_context:
        return
    raise ClientError(
        f"The {len(tools)} tools sent with this request take about {len(prompt) - without:,} tokens, more than "
        f"the {limits.max_context:,}-token window of '{deployment.name}' leaves beside the messages "
        f"({without:,} tokens) and the answer ({answer:,}). Send fewer tools (turn off those you do not need "
        'in your client), or tool_choice "none" to leave them out, or use a model with a larger window.',
        code="context_length_exceeded",
        param="tools",
    )


# The chat completion fields a request answered from the response cache may have: those that shape
# its answer are in its sampling (the cache's key); any other (a newer field, tools) makes it uncached.
_CACHEABLE_FIELDS = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "user",
    "safety_identifier",
    *("temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "seed", "logit_bias"),
    *("response_format", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids"),
}


def _cache_probe(*, user: User, request: dict[str, Any], deployment: ModelDeployment, sampling: dict[str, Any]) -> Any:
    """The response cache's answer (inference.caching) for a single-turn chat request: one user
    message after at most a system message, one choice, no field outside _CACHEABLE_FIELDS."""
    messages = request.get("messages") or []
    roles = [m["role"] for m in messages]
    if not deployment.semantic_cache or request.get("n", 1) != 1 or roles not in (["user"], ["system", "user"]):
        return None
    if any(value not in (None, False) for name, value in request.items() if name not in _CACHEABLE_FIELDS):
        return None
    return response_cache_probe(
        deployment=deployment,
        system_prompt=messages[0]["content"] if len(messages) == 2 else "",
        user_text=messages[-1]["content"],
        sampling=sampling,
        max_tokens=sampling["max_tokens"],
        user_id=user.id,
    )


def generation_promote_waiting(*, now: datetime | None = None) -> list[tuple[uuid.UUID, int]]:
    """Apply queue aging to generations waiting in the broker (see inference.execution.scheduling).

    Broker priorities alone are strict: a steady stream of paid work would keep a free request
    waiting forever. A queued generation whose effective priority has improved since its task was
    sent gets its task sent again at the better priority. The older copy stays behind in its lower
    list; whichever is taken first claims the generation and the other finds it claimed. Returns
    (id, new priority) for each promotion.
    """
    from inference.execution.dispatch import generation_dispatch
    from inference.execution.scheduling import effective_priority

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
    from inference.execution.dispatch import generation_dispatch

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
