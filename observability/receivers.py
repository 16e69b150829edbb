"""Where the other apps' signals become metrics, rolling samples and request ids across Celery.

No rule lives here: each receiver reads what the signal carries and records it.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections import OrderedDict
from typing import Any

from celery.signals import before_task_publish, task_postrun, task_prerun
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

import chatsite.request_context as request_context
from accounts.selectors import tier_for_user_id_or_none
from accounts.signals import request_refused
from inference.selectors import deployment_cached
from inference.signals import generation_finished, generation_first_token
from observability import metrics, store, tracing
from orchestration.signals import tool_call_ended

logger = logging.getLogger(__name__)

# When each running generation's first text was shown (wall clock, like the row's created_at):
# bounded, as a generation that never finishes here (its worker died) never removes its entry.
_first_token_at: OrderedDict[str, float] = OrderedDict()
FIRST_TOKENS_KEPT = 10_000


@receiver(generation_first_token)
def first_token_noted(sender: Any, generation: Any, **kwargs: Any) -> None:
    _first_token_at[str(generation.id)] = time.time()
    while len(_first_token_at) > FIRST_TOKENS_KEPT:
        _first_token_at.popitem(last=False)


def _outcome(generation: Any) -> tuple[str, str]:
    if generation.status == "complete":
        return "complete", ""
    if generation.status == "failed":
        return "failed", generation.error_code or "unknown"
    if generation.finish_reason == "content_filter":
        return "content_filter", ""
    return "stopped", ""


# Tier names by user id, read after the finish has committed and kept a minute: a label, not a rule,
# so a tier changed a moment ago may label one more answer with the old name.
_tier_names: OrderedDict[Any, tuple[str, float]] = OrderedDict()
TIER_NAMES_KEPT = 10_000
TIER_NAME_TTL_S = 60.0


def _tier_name(user_id: Any) -> str:
    now = time.monotonic()
    cached = _tier_names.get(user_id)
    if cached is not None and cached[1] > now:
        return cached[0]
    tier = tier_for_user_id_or_none(user_id=user_id)
    name = tier.name if tier is not None else ""
    _tier_names[user_id] = (name, now + TIER_NAME_TTL_S)
    while len(_tier_names) > TIER_NAMES_KEPT:
        _tier_names.popitem(last=False)
    return name


@receiver(generation_finished)
def generation_measured(sender: Any, generation: Any, **kwargs: Any) -> None:
    """A finished generation's timings and tokens, recorded once its end has committed."""
    first_at = _first_token_at.pop(str(generation.id), None)
    created = generation.created_at.timestamp()
    finished = generation.finished_at.timestamp() if generation.finished_at else time.time()
    started = generation.started_at.timestamp() if generation.started_at else None
    ttft = first_at - created if first_at is not None else None
    tpot = (
        (finished - first_at) / (generation.completion_tokens - 1)
        if first_at is not None and generation.completion_tokens > 1
        else None
    )
    outcome, code = _outcome(generation)
    deployment = deployment_cached(deployment_id=generation.deployment_id)
    deployment_name = deployment.name if deployment is not None else str(generation.deployment_id)
    channel = "title" if generation.purpose == "title" else request_context.channel.get()
    figures = {
        "deployment": deployment_name,
        "channel": channel,
        "outcome": outcome,
        "code": code,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": finished - created,
        "queue_wait_s": started - created if started is not None else None,
        "prompt": generation.prompt_tokens,
        "completion": generation.completion_tokens,
    }
    logger.info(
        "generation %s %s%s: ttft %s s, %s tokens in %.2f s",
        generation.id,
        outcome,
        f" ({code})" if code else "",
        f"{ttft:.3f}" if ttft is not None else "-",
        generation.completion_tokens,
        figures["e2e_s"],
    )

    tracing.generation_span(
        generation_id=str(generation.id),
        deployment=deployment_name,
        start_s=started if started is not None else created,
        end_s=finished,
        first_token_s=first_at,
        outcome=outcome,
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
    )

    def record() -> None:
        # The tier is read after the commit (and cached), not inside the finish's transaction.
        try:
            tier = _tier_name(generation.user_id)
        except Exception:
            tier = ""
        metrics.generation_observe(tier=tier, **figures)
        store.sample_add(
            {"k": "g", "d": deployment_name, "o": outcome, "ttft": ttft, "tok": generation.completion_tokens}
        )

    transaction.on_commit(record)


@receiver(request_refused)
def refusal_counted(sender: Any, status: int, code: str, **kwargs: Any) -> None:
    """A request turned away before an engine: counted by the channel it came through."""
    outcome = metrics.refusal_observe(channel=request_context.channel.get(), status=status, code=code)
    if outcome is not None:
        store.sample_add({"k": "r", "o": outcome})


@receiver(post_save, sender="moderation.Flag")
def moderation_action_counted(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    if not created:
        return
    source, action = instance.source, instance.action
    blocked = source == "input" and action in ("block", "block_and_review")

    def record() -> None:
        metrics.moderation_actions.labels(source=source, action=action).inc()
        store.sample_add({"k": "m", "s": source, "a": action})
        if blocked:
            metrics.requests.labels(
                deployment="", tier="", channel=request_context.channel.get(), outcome="blocked", code=action
            ).inc()
            store.sample_add({"k": "r", "o": "blocked"})

    transaction.on_commit(record)


# --- request ids through Celery --------------------------------------------------------------------

_task_tokens: dict[str, list[contextvars.Token]] = {}


@before_task_publish.connect
def request_id_sent_with_task(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """The task carries the request's id and channel in its headers (protocol 2 headers)."""
    if headers is not None:
        headers.update(request_context.headers())


@task_prerun.connect
def request_id_taken_from_task(task_id: str, task: Any, **kwargs: Any) -> None:
    rid = getattr(task.request, "request_id", None) or (task.request.headers or {}).get("request_id")
    channel = getattr(task.request, "request_channel", None) or (task.request.headers or {}).get("request_channel")
    if rid:
        _task_tokens[task_id] = [
            request_context.request_id.set(request_context.request_id_new(rid)),
            request_context.channel.set(channel or ""),
        ]


@task_postrun.connect
def request_id_forgotten(task_id: str, **kwargs: Any) -> None:
    tokens = _task_tokens.pop(task_id, None)
    if tokens:
        request_context.request_id.reset(tokens[0])
        request_context.channel.reset(tokens[1])


@receiver(tool_call_ended)
def tool_call_counted(sender: Any, name: str, outcome: str, seconds: float, **kwargs: Any) -> None:
    metrics.tool_call_observe(tool=name, outcome=outcome, seconds=seconds)
