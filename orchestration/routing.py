"""Which deployment serves a request: public model names, weights, stickiness, fallback and `auto`.

Every request for a model passes `route` (the chat page and the conversations API through
conversations.services, the OpenAI API through the hook inference keeps for it,
`inference.selectors.deployment_route`), and the generation records what it chose and why
(`Generation.routing_reason`).

- A **public model name** is what clients ask for: a deployment's `public_name`, or its own name when
  that is empty. Several deployments may share one; each takes new requests in proportion to its
  `weight` (blue-green and canary roll-outs are weight changes in the admin). Weight 0 **drains** a
  deployment: it takes no new requests or conversations, and the answers it is writing finish.
- **Per tier**: only the deployments the user's tier includes are candidates, so one name can mean a
  small model on the free plan and a larger one on pro.
- **Stickiness**: a conversation keeps the deployment it was routed to (the engine's prefix cache
  holds its history) until that one is drained, disabled, no longer serves the conversation's name,
  has a full queue or a failed engine. Its workers being away for a moment (a restart) keeps it
  waiting, as a message always has, rather than moving it.
- **Fallback**: when the chosen deployment cannot take the request (its queue at `max_queued`, its
  engine failed, no live worker serving it), the next candidate takes it: the heaviest first. One
  without a live worker is taken only when no live one can, and then waits for its worker. When none
  can take it: 503 with Retry-After.
- **`auto`** picks among every deployment the tier includes by what the request needs
  (`auto_order`, the rule in one function).

With a single deployment behind a name there is nothing to choose, and routing costs no statement
beyond the one that read that deployment with its queue's length (as before routing existed).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from django.conf import settings

from accounts.selectors import tier_for_user_or_none
from chatsite.errors import ClientError
from inference.execution.dispatch import host_state
from inference.models import ModelDeployment
from inference.selectors import Routed, deployment_candidates, generation_queued_count

AUTO = "auto"
AUTO_LABEL = "Auto (picks a model for each message)"

PromptTokens = Callable[[ModelDeployment], int]


def route(
    *,
    user: Any,
    model: str,
    sticky: ModelDeployment | None = None,
    prompt_tokens: PromptTokens | None = None,
    rng: random.Random | None = None,
) -> Routed:
    """The deployment that serves `user`'s request for the public `model` (or `auto`), and why.

    `sticky`: the deployment the request's conversation is on, kept while it serves `model` and can
    take the request. `prompt_tokens`: the request's prompt measured with a deployment's tokenizer
    (what `auto` weighs against each window). `rng`: the weighted draw's source (tests seed it).
    Raises 404 model_not_found, 403 model_not_allowed, or 503 with Retry-After when none can take it.
    """
    if sticky is not None and model != AUTO and _keeps(sticky, model=model):
        return Routed(sticky, "sticky: the conversation's deployment")
    candidates = _candidates(model)
    tier = tier_for_user_or_none(user=user) if len(candidates) > 1 or model == AUTO else None
    if tier is not None and not tier.all_deployments:
        allowed = set(tier.deployments.values_list("id", flat=True))
        candidates = [d for d in candidates if d.id in allowed]
        if not candidates:
            raise ClientError(
                f"Your plan ({tier}) does not include the model '{model}'.",
                code="model_not_allowed",
                status=403,
                param="model",
            )
    live = [d for d in candidates if d.weight > 0]
    if not live:
        raise _unavailable(model, "every deployment of it is drained")
    if model == AUTO:
        ordered = auto_order(
            live,
            max_context=tier.max_context if tier is not None else None,
            prompt_tokens=prompt_tokens or (lambda d: 0),
            sticky=sticky,
        )
    else:
        ordered = weighted_order(live, rng=rng or random)
    return _first_that_takes(ordered, model=model)


def _keeps(sticky: ModelDeployment, *, model: str) -> bool:
    """Whether a conversation stays on its deployment: no statement, as the send read it already
    (with its queue's length) when it locked the conversation."""
    if not (sticky.is_enabled and sticky.weight > 0 and sticky.public_model == model):
        return False
    return sticky.task == ModelDeployment.Task.GENERATE and _refusal(sticky, engines=True, soft=False) is None


def _candidates(model: str) -> list[ModelDeployment]:
    """The enabled deployments serving `model` (every chat one for `auto`), heaviest first, each with
    its queue's length (`queued_now`), in one statement."""
    found = deployment_candidates(model=None if model == AUTO else model)
    if not found:
        raise ClientError(f"The model '{model}' does not exist.", code="model_not_found", param="model", status=404)
    serving: list[ModelDeployment] = [d for d in found if d.task == ModelDeployment.Task.GENERATE]
    if not serving:
        raise ClientError(
            f"The model '{model}' serves {found[0].get_task_display().lower()}, not this endpoint.",
            code="model_not_supported",
            param="model",
        )
    return serving


def weighted_order(deployments: list[ModelDeployment], *, rng: Any) -> list[tuple[ModelDeployment, str]]:
    """One deployment drawn by weight, then the others heaviest first (the fallbacks)."""
    if len(deployments) == 1:
        return [(deployments[0], f"the only deployment of '{deployments[0].public_model}'")]
    total = sum(d.weight for d in deployments)
    first = rng.choices(deployments, weights=[d.weight for d in deployments])[0]
    rest = [d for d in deployments if d.id != first.id]
    return [(first, f"weighted: {first.weight} of {total}"), *((d, f"weight {d.weight} of {total}") for d in rest)]


def auto_order(
    deployments: list[ModelDeployment],
    *,
    max_context: int | None,
    prompt_tokens: PromptTokens,
    sticky: ModelDeployment | None = None,
) -> list[tuple[ModelDeployment, str]]:
    """The `auto` model's rule, best first, each with why.

    1. The request fits: its prompt plus a minimal answer within the deployment's window (capped at
       the tier's `max_context`). A deployment it does not fit only comes after every one it fits,
       the largest window first (its window policy then drops the oldest turns).
    2. The shortest queue, as a share of the deployment's `max_queued`.
    3. The smallest window that fits: the larger ones stay free for the prompts that need them.
    4. The conversation's own deployment (its prefix cache), then the heavier weight, then the name.
    """
    min_output = settings.INFERENCE_MIN_OUTPUT_TOKENS

    def measured(deployment: ModelDeployment) -> tuple[tuple[Any, ...], str]:
        window = min(deployment.max_context, max_context or deployment.max_context)
        tokens = prompt_tokens(deployment)
        fits = tokens + min_output <= window
        queued = queued_now(deployment)
        load = queued / deployment.max_queued
        key = (
            not fits,
            load,
            window if fits else -window,
            sticky is None or deployment.id != sticky.id,
            -deployment.weight,
            deployment.name,
        )
        verdict = "fits" if fits else "does not fit"
        why = (
            f"auto: a {tokens}-token prompt {verdict} its {window}-token window; "
            f"queue {queued} of {deployment.max_queued}"
        )
        return key, why

    ranked = sorted(((measured(d), d) for d in deployments), key=lambda item: item[0][0])
    return [(deployment, why) for (_, why), deployment in ranked]


def _first_that_takes(ordered: list[tuple[ModelDeployment, str]], *, model: str) -> Routed:
    """The first deployment in `ordered` that can take the request; with one candidate only its queue
    decides, as before routing. One with no live worker is taken only when no live one can."""
    engines = len(ordered) > 1
    skipped: list[str] = []
    refusals: list[str] = []
    for soft in (True, False) if engines else (False,):
        refusals = []
        for deployment, reason in ordered:
            refusal = _refusal(deployment, engines=engines, soft=soft)
            if refusal is None:
                if skipped:
                    reason = f"{reason}; fallback: {'; '.join(skipped)}"
                return Routed(deployment, reason[:300])
            refusals.append(refusal)
            if soft:
                skipped.append(f"{deployment.name} {refusal}")
    if all(refusal.startswith(FULL) for refusal in refusals):
        raise ClientError(
            f"The model '{model}' is at capacity right now. Try again in a moment.",
            code="at_capacity",
            status=503,
            retry_after=settings.INFERENCE_AT_CAPACITY_RETRY_S,
        )
    raise _unavailable(model, "no deployment of it can take a request")


FULL = "has a full queue"


def _refusal(deployment: ModelDeployment, *, engines: bool, soft: bool) -> str | None:
    """Why `deployment` cannot take a request now, or None. Its queue always counts; with `engines`,
    a failed engine too; with `soft` as well, no live worker serving it."""
    queued = queued_now(deployment)
    if queued >= deployment.max_queued:
        return f"{FULL} ({queued} of {deployment.max_queued})"
    if engines:
        state = host_state(deployment.answer_model)
        if state == "failed":
            return "has a failed engine"
        if soft and state == "offline":
            return "has no live worker"
    return None


def queued_now(deployment: ModelDeployment) -> int:
    """How many of its generations wait in its queue: as read with its row (`queued_now`), else
    counted once and kept there, where `generation_admit` finds it."""
    queued = getattr(deployment, "queued_now", None)
    if queued is None:
        queued = vars(deployment)["queued_now"] = generation_queued_count(deployment=deployment)
    return int(queued)


def _unavailable(model: str, why: str) -> ClientError:
    return ClientError(
        f"The model '{model}' cannot take requests right now ({why}). Try again in a moment.",
        code="model_unavailable",
        status=503,
        retry_after=settings.INFERENCE_AT_CAPACITY_RETRY_S,
    )
