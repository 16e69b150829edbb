"""POST /v1/completions: OpenAI's legacy text completions, streamed over SSE or not.

The chat completion's path with a raw prompt: the same key, plan, limits, quotas, queue and input
moderation (the prompt is judged as a chat's newest user message is), the same generations and
ledger rows; only the prompt (text or token ids, not rendered in the chat template) and the wire
shape (`text_completion`, `choices[].text`) differ. Fields OpenAI has and this service cannot honour
(`echo`, `best_of` above `n`, `suffix`) are refused with a 400 naming them; `logprobs` (the number
of most likely tokens to give beside each sampled one) is vLLM's, in the legacy shape.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import ApiKeyAuthentication, HasScope, api_key_caller
from accounts.metering import ADMITTED, metered
from chatsite.database import db_async
from chatsite.errors import ClientError
from chatsite.parsers import request_body, validated_json_body
from inference.engine.tokenizers import tokenizer_for
from inference.openai import responding, wire
from inference.openai.fields import MAX_TOP_LOGPROBS, StopAndStreamOptions
from inference.openai.ratelimits import with_rate_limits
from inference.openai.services import completion_create_checked
from inference.selectors import deployment_serving

# OpenAI's default for this endpoint (and vLLM's): a text completion is a short continuation.
DEFAULT_MAX_TOKENS = 16


class CompletionInputSerializer(StopAndStreamOptions, serializers.Serializer):
    model = serializers.CharField(max_length=100)
    prompt = serializers.JSONField(help_text="A string, a list of one string, or a list of token ids.")
    stream = serializers.BooleanField(default=False)
    stream_options = serializers.DictField(required=False, allow_null=True)
    n = serializers.IntegerField(min_value=1, max_value=8, default=1)
    best_of = serializers.IntegerField(min_value=1, max_value=8, required=False, allow_null=True)
    temperature = serializers.FloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = serializers.FloatField(min_value=0.001, max_value=1, required=False, allow_null=True)
    max_tokens = serializers.IntegerField(min_value=1, max_value=10**6, required=False, allow_null=True)
    stop = serializers.JSONField(required=False, allow_null=True)
    seed = serializers.IntegerField(min_value=-(2**63), max_value=2**63 - 1, required=False, allow_null=True)
    presence_penalty = serializers.FloatField(min_value=-2, max_value=2, required=False, allow_null=True)
    frequency_penalty = serializers.FloatField(min_value=-2, max_value=2, required=False, allow_null=True)
    echo = serializers.BooleanField(required=False, allow_null=True)
    logprobs = serializers.IntegerField(min_value=0, max_value=MAX_TOP_LOGPROBS, required=False, allow_null=True)
    suffix = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    user = serializers.CharField(max_length=256, required=False, allow_blank=True)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: ["This field is not supported."]})
        return super().to_internal_value(data)

    def validate_prompt(self, prompt: Any) -> str | list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if not prompt:
                raise serializers.ValidationError("The prompt cannot be empty.")
            if "\x00" in prompt:
                raise serializers.ValidationError("The prompt cannot contain NUL characters.")
            if len(prompt) > settings.API_MAX_PROMPT_CHARS:
                raise serializers.ValidationError(
                    f"The prompt is longer than {settings.API_MAX_PROMPT_CHARS} characters."
                )
            return prompt
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in prompt)
        ):
            return prompt
        raise serializers.ValidationError(
            "Send one prompt: a string, or a list of token ids (several prompts in one request are not supported)."
        )

    def validate_echo(self, echo: bool | None) -> bool | None:
        if echo:
            raise serializers.ValidationError("echo is not supported.")
        return echo

    def validate_suffix(self, suffix: str | None) -> str | None:
        if suffix:
            raise serializers.ValidationError("suffix (insertion) is not supported.")
        return suffix

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("best_of") not in (None, data["n"]):
            raise serializers.ValidationError({"best_of": ["best_of must equal n (no server-side ranking)."]})
        if data.get("max_tokens") is None:
            data["max_tokens"] = DEFAULT_MAX_TOKENS
        return data


def _error(exc: ClientError) -> JsonResponse:
    response = JsonResponse(
        wire.error_body(message=exc.message, status=exc.status, code=exc.code, param=exc.param), status=exc.status
    )
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


def _moderated_text(data: dict[str, Any]) -> str:
    """What input moderation judges: the prompt's text (token ids are judged as the text they spell)."""
    prompt = data["prompt"]
    if isinstance(prompt, str):
        return prompt

    deployment = deployment_serving(model=data["model"])
    return tokenizer_for(deployment.model_path).decode(prompt, skip_special_tokens=True)


def _judged_text(data: dict[str, Any]) -> str:
    try:
        return _moderated_text(data)
    except (ClientError, OverflowError, IndexError):
        return ""  # the queueing refuses the request with its own error


@metered(ADMITTED)
@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return _error(ClientError("Use POST.", code="method_not_allowed", status=405))
    user = api_key = None
    try:
        user, api_key = await db_async(lambda: api_key_caller(request, scope="chat"))()
        data = validated_json_body(request_body(request), CompletionInputSerializer)
        text = data["prompt"] if isinstance(data["prompt"], str) else await db_async(_judged_text)(data)
        generations = await completion_create_checked(db_async, user=user, api_key=api_key, request=data, text=text)
    except ClientError as exc:
        return await with_rate_limits(_error(exc), user=user, api_key=api_key)
    ids = [str(g.id) for g in generations]
    include_usage = bool((data.get("stream_options") or {}).get("include_usage"))
    # The model that writes it: the deployment its name was routed to (orchestration.routing).
    shape = responding.TextShape(
        completion_id=f"cmpl-{generations[0].id.hex}",
        created=int(time.time()),
        model=generations[0].deployment.answer_model,
        include_usage=data["stream"] and include_usage,
        logprobs=data.get("logprobs") is not None,
    )
    if data["stream"]:
        stream = responding.streamed(ids, shape, include_usage=include_usage)
        response = StreamingHttpResponse(stream, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return await with_rate_limits(response, user=user, api_key=api_key)
    return await with_rate_limits(await responding.whole(ids, shape), user=user, api_key=api_key)


class CompletionApi(APIView):
    """Documentation only: the schema of `completions`, a plain async view (see conversations'
    MessageSendApi for why)."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "chat"

    @extend_schema(
        operation_id="completions_create",
        summary="Complete a text prompt (OpenAI's legacy completions; SSE with stream: true)",
        request=CompletionInputSerializer,
        responses={
            200: OpenApiResponse(
                response=inline_serializer(
                    "TextCompletion",
                    {
                        "id": serializers.CharField(),
                        "object": serializers.CharField(),
                        "created": serializers.IntegerField(),
                        "model": serializers.CharField(),
                        "choices": serializers.ListField(child=serializers.DictField()),
                        "usage": serializers.DictField(),
                    },
                ),
                description="The completion, or with stream: true `text_completion` chunks as Server-Sent Events.",
            ),
            400: OpenApiResponse(description="Invalid body, an unsupported field, or a prompt over the window."),
            401: OpenApiResponse(description="No valid API key."),
            403: OpenApiResponse(description="The key lacks the chat scope, or the plan lacks the model."),
            404: OpenApiResponse(description="No such model."),
            429: OpenApiResponse(description="Rate limit or quota reached; see Retry-After."),
        },
    )
    def post(self, request: Request) -> Response:  # pragma: no cover
        raise exceptions.MethodNotAllowed("POST")


# What drf-spectacular reads to document a plain async view as a DRF one.
setattr(completions, "cls", CompletionApi)  # noqa: B010
setattr(completions, "initkwargs", {})  # noqa: B010
