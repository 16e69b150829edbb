"""The OpenAI API's completions: a request checked against the plan and the window, its prompt
rendered in the deployment's chat template (tools included), and its `n` generations queued, held
while its newest user text is still being scored (`inference.held`).

The chat page's sends are conversations' (`conversations.services.message_send`); both queue their
generations through `inference.services.generation_create`.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

from accounts.models import ApiKey, User
from accounts.selectors import tier_for_user
from accounts.services import Admission, RequestLimits, request_admit, request_limits, request_size_check
from chatsite.database import DatabaseCall
from chatsite.errors import ClientError
from chatsite.parsers import JsonObject
from inference.caching import CacheProbe, response_cache_probe
from inference.engine.base import PromptImage
from inference.engine.tokenizers import Tokenizer, render_chat, tokenizer_for
from inference.held import HeldAnswer, with_input_check
from inference.hooks import ImageRead, image_read
from inference.images import ImageSource, image_fetch
from inference.models import Generation, ModelDeployment
from inference.openai.fields import choice_seed, completion_sampling, token_ids_check
from inference.openai.tools import tool_sampling, tools_check, tools_in_prompt
from inference.selectors import deployment_route
from inference.services import generation_admit, generation_create
from moderation.services import InputCheck, Verdict, input_moderate


def content_text(content: str | list[JsonObject] | None) -> str:
    """A message's text: its content, or its text parts' (a turn with images)."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return content or ""


def newest_user_text(request: JsonObject) -> str:
    """What input moderation judges in a chat completion: its newest user message and the tool
    results after it, the turn's new input from the client's tools, and what its images say (the
    text OCR read in them). A conversation with no user message (a system prompt alone, which vLLM
    answers too) is judged whole: its text is all the input there is."""
    texts: list[str] = []
    read = [image.text for image in request.get("images") or () if isinstance(image, ImageRead) and image.text]
    for message in reversed(request["messages"]):
        if message["role"] == "user":
            return "\n\n".join([content_text(message["content"]), *reversed(texts), *read])
        if message["role"] == "tool":
            texts.append(message["content"])
    return "\n\n".join([*(content_text(m["content"]) for m in request["messages"] if m["content"]), *read])


def images_accepted_check(*, model: str) -> None:
    """Before any image is fetched or decoded: a 404 for a model no deployment answers to, a 400 for
    images sent to a model none of whose deployments takes them (routing checks the one it picks)."""
    named = ModelDeployment.objects.filter(Q(public_name=model) | Q(name=model), is_enabled=True)
    if not named.exists():
        if model != AUTO_MODEL:
            raise ClientError(f"The model '{model}' does not exist.", code="model_not_found", param="model", status=404)
    elif not named.filter(accepts_images=True).exists():
        raise _images_refused(model)


# The name that asks the router to choose (orchestration.routing), which sits above this layer.
AUTO_MODEL = "auto"


def _images_refused(model: str) -> ClientError:
    return ClientError(
        f"The model '{model}' does not accept images: send text content parts only, or choose a vision model.",
        code="images_not_supported",
        param="messages",
    )


def images_read(*, user: User, sources: list[ImageSource]) -> list[ImageRead]:
    """Each image of a request, fetched where it is an address (inference.images), cleaned within the
    user's plan and its text read (the layer above's reader, `inference.hooks`)."""
    read = []
    try:
        for source in sources:
            data = source.data
            if data is None:
                data = image_fetch(source.url, max_bytes=tier_for_user(user=user).max_image_bytes)
            read.append(image_read(user=user, data=data))
    finally:
        # Called in a thread of its own (the reading takes seconds, which no database thread should
        # wait out): the connection its reads opened is closed with it.
        connection.close()
    return read


@dataclass(frozen=True)
class Completion:
    """What `completion_create` queued: the generations of one completion (`n` of them), with their
    verdict `pending` where the scores of the text were not in when the transaction had done
    everything else (they are committed held; `settled` takes the verdict)."""

    generations: list[Generation]
    pending: _HeldCompletion | None = None

    def settled(self, check: InputCheck) -> list[Generation]:
        """The generations, the pending verdict (if any) taken now from `check`, waiting for its
        scores: for sync callers. Blocked: refused with 400 `content_policy_violation`."""
        return self.pending.settle(check) if self.pending is not None else self.generations


def completion_create(
    *, user: User, api_key: ApiKey | None, request: JsonObject, check: InputCheck | None = None
) -> Completion:
    """Moderate the newest user message and queue the completion (see _completion_queue).

    `check` is input moderation's check of `newest_user_text(request)`, its verdict taken under the
    tier the transaction reads (the API views make one that scores the text after the commit, the
    generations held meanwhile: `completion_create_checked`); without one, the text is classified
    before the transaction opens, so no lock is held while the classifier runs. A blocked request is
    refused with 400 `content_policy_violation`: nothing stays queued, and nothing is shown or
    charged (generations committed held while the scores were coming are withdrawn).
    """
    if check is None:
        check = InputCheck.decided(input_moderate(user=user, text=newest_user_text(request)))
    return _completion_queue(user=user, api_key=api_key, request=request, check=check)


async def completion_create_checked(
    call: DatabaseCall, *, user: User, api_key: ApiKey | None, request: JsonObject, text: str
) -> list[Generation]:
    """`completion_create` from an async view, through `call`, with input moderation's check of
    `text` scored after the commit on the event loop (no database thread waits for the scores) and
    the pending verdict settled in a call of its own. Both calls run to their end even if the
    client goes, so committed work is always released or withdrawn."""

    async def create(check: InputCheck) -> list[Generation]:
        queued = await call(completion_create)(user=user, api_key=api_key, request=request, check=check)
        return queued.generations if queued.pending is None else await queued.pending.settled(call, check)

    return await with_input_check(text, create)


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
def _completion_queue(*, user: User, api_key: ApiKey | None, request: JsonObject, check: InputCheck) -> Completion:
    """Queue the generations of one OpenAI chat completion (`n` of them), after every check.

    The client owns the whole conversation here, system prompt included, so nothing is dropped to
    fit: a prompt that does not fit the window (with the answer asked for) is refused, as OpenAI does.
    The same gate as the chat page applies: the plan's models, limits, quotas and the queue bound.
    The input check's verdict is taken once the prompt is rendered, which does not depend on it; if
    its scores are still coming then, the generations are queued held and the verdict is taken after
    the commit (`inference.held`), as a chat message's is. A request that is both refused
    and blocked is refused as blocked.
    """
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
    if request.get("images") and not deployment.accepts_images:
        raise _images_refused(deployment.name)
    tools_check(request, deployment=deployment)
    limits = request_limits(user=user, deployment=deployment, api_key=api_key)
    # Before the prompt is tokenized or its verdict asked for (which starts the scoring).
    request_size_check(chars=_prompt_chars(request), limits=limits)
    tokenizer = tokenizer_for(deployment.model_path)
    prompt = prompt_on(deployment)
    taken = check.verdict_if_scored(tier_id=limits.tier.id)
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
        if taken is None:
            taken = check.verdict(tier_id=limits.tier.id)
        if taken is not None and taken.blocks:
            raise ClientError(taken.explanation(), code="content_policy_violation", param="messages") from None
        raise
    if taken is not None:
        return Completion(generations)
    # No app recovers a held completion for a runner's last resort (its client went with its web
    # process): `text` is what was judged, for the record.
    text = newest_user_text(request) if "messages" in request else request["prompt"]
    held = _HeldCompletion(
        user=user,
        text=text if isinstance(text, str) else "",
        generations=generations,
        admissions=admissions,
        tier_id=limits.tier.id,
    )
    return Completion(generations, pending=held)


def _prompt_chars(request: JsonObject) -> int:
    if "prompt" in request:  # a text completion (/v1/completions): its prompt is text or token ids
        return len(request["prompt"])
    calls = (c["function"]["arguments"] for m in request["messages"] for c in m.get("tool_calls") or ())
    return sum(len(content_text(m["content"])) for m in request["messages"]) + sum(len(a) for a in calls)


def _prompt_ids(tokenizer: Tokenizer, request: JsonObject, *, deployment: ModelDeployment) -> list[int]:
    """The prompt's token ids: a chat's messages (and tools) in the deployment's chat template; a
    text completion's prompt as it is (its client owns the whole text, special tokens included, as
    with vLLM), or its token ids, which must be the model's."""
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
    request: JsonObject,
    deployment: ModelDeployment,
    limits: RequestLimits,
    prompt: list[int],
    tokenizer: Tokenizer,
    awaiting_verdict: bool,
    routing_reason: str = "",
) -> tuple[list[Generation], list[Admission]]:
    """The checks a completion's prompt must pass, then its `n` generations queued and charged (held
    until the verdict is in, with `awaiting_verdict`).

    Without `max_tokens`, the answer may use the rest of the window, within the plan's output cap,
    as OpenAI and vLLM allow (the chat page's shorter default budget is for people, not clients)."""
    asked = request.get("max_completion_tokens") or request.get("max_tokens")
    images = [PromptImage(image.content_type, image.data) for image in request.get("images") or ()]
    # An image's tokens are the engine's to count (that count is charged); until then, the model's estimate.
    image_tokens = len(images) * deployment.image_tokens
    needed = len(prompt) + image_tokens + (asked or settings.INFERENCE_MIN_OUTPUT_TOKENS)
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
    max_tokens = asked or min(limits.output_cap, limits.max_context - len(prompt) - image_tokens)
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
            prompt_tokens=len(prompt) + image_tokens,
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
                images=images,
            )
        )
        if cache is not None:
            cache.keep(generation_id=generations[-1].id)
        admissions.append(admission)
    return generations, admissions


def _tools_fit_check(
    request: JsonObject,
    *,
    prompt: list[int],
    answer: int,
    tokenizer: Tokenizer,
    deployment: ModelDeployment,
    limits: RequestLimits,
) -> None:
    """A prompt over the window because of its tools is refused in words a person can act on: a
    frontend that attaches its tools to every message (Open WebUI sends dozens) fails every
    question, however short, and the person must learn that the tools, not the question, are the
    cause. Passes when there are no tools, or when the messages alone do not fit either."""
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


def _cache_probe(
    *, user: User, request: JsonObject, deployment: ModelDeployment, sampling: JsonObject
) -> CacheProbe | None:
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
