"""The OpenAI-compatible API: /v1/chat/completions (streamed over SSE or not) and /v1/models.

Chat completions is a plain async view rather than a DRF APIView: a completion waits on the engine,
and that wait belongs on the event loop, not in a thread. It still uses DRF's pieces: the API-key
authenticator and a serializer for validation. Errors are OpenAI's shape with OpenAI's statuses,
so the official client raises its own exception types.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import ApiKeyAuthentication, HasScope, require_scope
from chatsite.database import db_async
from chatsite.errors import ClientError, validated_json_body
from chatsite.parsers import request_body
from inference.openai import wire
from inference.openai.fields import SamplingFieldsSerializer
from inference.services import completion_create, newest_user_text
from inference.streaming.following import FOLLOW_TIMEOUT_MESSAGE, follow_streams, stopped_if_abandoned
from inference.streaming.streams import ServerRestarting
from moderation.services import checked_after_commit


class ChatCompletionInputSerializer(SamplingFieldsSerializer):
    model = serializers.CharField(max_length=100)
    messages = serializers.ListField(child=serializers.DictField(), min_length=1, max_length=512)
    stream = serializers.BooleanField(default=False)
    stream_options = serializers.DictField(required=False, allow_null=True)
    n = serializers.IntegerField(min_value=1, max_value=8, default=1)
    temperature = serializers.FloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = serializers.FloatField(min_value=0.001, max_value=1, required=False, allow_null=True)
    max_tokens = serializers.IntegerField(min_value=1, max_value=10**6, required=False, allow_null=True)
    max_completion_tokens = serializers.IntegerField(min_value=1, max_value=10**6, required=False, allow_null=True)
    stop = serializers.JSONField(required=False, allow_null=True)
    seed = serializers.IntegerField(min_value=-(2**63), max_value=2**63 - 1, required=False, allow_null=True)
    presence_penalty = serializers.FloatField(min_value=-2, max_value=2, required=False, allow_null=True)
    frequency_penalty = serializers.FloatField(min_value=-2, max_value=2, required=False, allow_null=True)
    user = serializers.CharField(max_length=256, required=False, allow_blank=True)

    def validate_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
        cleaned = []
        for message in messages:
            role = message.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise serializers.ValidationError("Each message needs a role: system, developer, user or assistant.")
            content = message.get("content")
            if isinstance(content, list):  # content parts: text only
                if not all(
                    isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
                ):
                    raise serializers.ValidationError("Only text content parts are supported.")
                content = "".join(p["text"] for p in content)
            if not isinstance(content, str):
                raise serializers.ValidationError("Each message's content must be a string or a list of text parts.")
            if "\x00" in content:
                raise serializers.ValidationError("Message content cannot contain NUL characters.")
            cleaned.append({"role": "system" if role == "developer" else role, "content": content})
        if sum(len(m["content"]) for m in cleaned) > settings.API_MAX_PROMPT_CHARS:
            raise serializers.ValidationError(
                f"The messages are longer than {settings.API_MAX_PROMPT_CHARS} characters."
            )
        if not any(m["role"] == "user" for m in cleaned):
            raise serializers.ValidationError("The messages need at least one user message.")
        return cleaned

    def validate_stop(self, stop: Any) -> list[str]:
        if stop is None:
            return []
        stops = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stops, list)
            or len(stops) > 4
            or not all(isinstance(s, str) and 0 < len(s) <= 100 for s in stops)
        ):
            raise serializers.ValidationError("stop must be a string or a list of up to 4 strings.")
        return stops

    def validate_stream_options(self, options: dict[str, Any] | None) -> dict[str, Any]:
        options = options or {}
        if not isinstance(options.get("include_usage", False), bool):
            raise serializers.ValidationError("include_usage must be a boolean.")
        return options


def _error(exc: ClientError) -> JsonResponse:
    response = JsonResponse(
        wire.error_body(message=exc.message, status=exc.status, code=exc.code, param=exc.param), status=exc.status
    )
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


def _authenticate(request: HttpRequest) -> tuple[Any, Any]:
    """The API key's owner and the key, or a 401/403 ClientError. Keys only: no cookies on /v1."""
    drf_request = Request(request)
    try:
        result = ApiKeyAuthentication().authenticate(drf_request)
    except exceptions.AuthenticationFailed as exc:
        raise ClientError(str(exc.detail), code="invalid_api_key", status=401) from None
    if result is None:
        raise ClientError(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            code="invalid_api_key",
            status=401,
        )
    drf_request.user, drf_request.auth = result
    try:
        require_scope(drf_request, "chat")
    except exceptions.PermissionDenied as exc:
        raise ClientError(str(exc.detail), code="insufficient_scope", status=403) from None
    if not result[0].is_active:
        raise ClientError("This account is disabled.", code="account_disabled", status=403)
    return result


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _error(ClientError("Use POST.", code="method_not_allowed", status=405))
    try:
        user, api_key = await db_async(_authenticate)(request)
        data = validated_json_body(request_body(request), ChatCompletionInputSerializer)
        # Scored once the completion is committed held: the engine starts on it meanwhile.
        generations = await checked_after_commit(
            db_async, completion_create, text=newest_user_text(data), user=user, api_key=api_key, request=data
        )
    except ClientError as exc:
        return _error(exc)
    ids = [str(g.id) for g in generations]
    meta = {"completion_id": f"chatcmpl-{generations[0].id.hex}", "created": int(time.time()), "model": data["model"]}
    if data["stream"]:
        include_usage = bool(data["stream_options"].get("include_usage")) if data.get("stream_options") else False
        response = StreamingHttpResponse(_stream(ids, meta, include_usage), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    return await _complete(ids, meta)


async def _stream(ids: list[str], meta: dict[str, Any], include_usage: bool):
    def chunk(i: int, **delta: Any) -> bytes:
        return wire.sse(wire.chunk(**meta, choices=[wire.delta_choice(i, **delta)], include_usage=include_usage))

    index = {generation_id: i for i, generation_id in enumerate(ids)}
    sent = [""] * len(ids)
    # A choice's role goes out with its first text, not before prefill: a client timing its first
    # token times the answer's, as from OpenAI and vLLM.
    started = [False] * len(ids)

    def text_chunk(i: int, text: str) -> bytes:
        role = None if started[i] else "assistant"
        started[i] = True
        return chunk(i, role=role, content=text)

    usage = wire.usage(0, 0)
    try:
        async with stopped_if_abandoned(ids) as following:
            async with aclosing(follow_streams(ids)) as events:
                async for event in events:
                    i = index[event["generation"]]
                    if event["type"] == "generation.delta":
                        sent[i] += event["text"]
                        yield text_chunk(i, event["text"])
                    elif event["type"] == "generation.done":
                        # An end made from the row carries the whole text (`ends_from_rows`): send
                        # what the deltas did not.
                        rest = _unsent(sent[i], event.get("text"))
                        if rest or not started[i]:
                            yield text_chunk(i, rest)
                        yield chunk(i, finish=wire.finish_reason(event.get("finish_reason")))
                        usage = _add_usage(usage, event.get("usage") or {}, first=i == 0)
                    else:  # a failed choice ends the response; the others are stopped
                        yield wire.sse(_failure_body(event))
                        return
            following.ended = True
    except TimeoutError:
        yield wire.sse(wire.error_body(message=FOLLOW_TIMEOUT_MESSAGE, status=504, code="timeout"))
        return
    except ServerRestarting:
        # An OpenAI stream cannot be resumed: it ends with an error, and its answers are stopped
        # (charged for what they had generated), as when its client goes away.
        yield wire.sse(wire.error_body(message=SERVER_RESTARTING_MESSAGE, status=503, code="server_restarting"))
        return
    if include_usage:
        yield wire.sse(wire.chunk(**meta, choices=[], usage=usage, include_usage=True))
    yield wire.sse("[DONE]")


async def _complete(ids: list[str], meta: dict[str, Any]) -> JsonResponse:
    index = {generation_id: i for i, generation_id in enumerate(ids)}
    texts, reasons = [""] * len(ids), ["stop"] * len(ids)
    usage = wire.usage(0, 0)
    try:
        async with stopped_if_abandoned(ids) as following, aclosing(follow_streams(ids)) as events:
            async for event in events:
                i = index[event["generation"]]
                if event["type"] == "generation.delta":
                    texts[i] += event["text"]
                elif event["type"] == "generation.done":
                    # The text a `done` carries replaces the deltas': a content filter's cut, or the
                    # whole answer when its end came from its row (`ends_from_rows`).
                    texts[i] = event.get("text", texts[i])
                    reasons[i] = wire.finish_reason(event.get("finish_reason"))
                    usage = _add_usage(usage, event.get("usage") or {}, first=i == 0)
                else:  # a failed choice fails the request; the others are stopped
                    return JsonResponse(_failure_body(event), status=500)
            following.ended = True
    except TimeoutError:
        return JsonResponse(wire.error_body(message=FOLLOW_TIMEOUT_MESSAGE, status=504, code="timeout"), status=504)
    except ServerRestarting:
        body = wire.error_body(message=SERVER_RESTARTING_MESSAGE, status=503, code="server_restarting")
        return JsonResponse(body, status=503)
    return JsonResponse(wire.completion(**meta, texts=texts, reasons=reasons, usage=usage))


def _unsent(sent: str, whole: str | None) -> str:
    """What of `whole`, an answer's text as its `done` gives it, the deltas have not sent: nothing
    when it is not a continuation of what they sent (a cut cannot take back what a stream sent)."""
    if whole is None or not whole.startswith(sent):
        return ""
    return whole[len(sent) :]


SERVER_RESTARTING_MESSAGE = "The server is restarting. Try the request again."


def _failure_body(event: dict[str, Any]) -> dict[str, Any]:
    return wire.error_body(message=event.get("message", "The generation failed."), status=500, code=event.get("code"))


def _add_usage(total: dict[str, int], usage: dict[str, int], *, first: bool) -> dict[str, int]:
    """n choices share one prompt: count its tokens once, every choice's completion."""
    prompt = usage.get("prompt_tokens", 0) if first else 0
    return wire.usage(total["prompt_tokens"] + prompt, total["completion_tokens"] + usage.get("completion_tokens", 0))


class ChatCompletionApi(APIView):
    """Documentation only: the schema of `chat_completions`, which serves the requests (a plain
    async view, which drf-spectacular finds through the `cls` attribute, as the conversations API's)."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "chat"

    @extend_schema(
        operation_id="chat_completions_create",
        summary="Create a chat completion (OpenAI's format; streamed over Server-Sent Events with `stream`)",
        description="Every field is honoured or refused with a 400 naming it (`param`); docs/api.md has the table.",
        request=ChatCompletionInputSerializer,
        responses={
            (200, "application/json"): OpenApiResponse(response=OpenApiTypes.OBJECT, description="A chat.completion."),
            (200, "text/event-stream"): OpenApiResponse(
                response=OpenApiTypes.STR, description="chat.completion.chunk events, then `data: [DONE]`."
            ),
            400: OpenApiResponse(description="An invalid, unsupported or unknown field, named in `param`."),
            401: OpenApiResponse(description="No API key, or an invalid one."),
            403: OpenApiResponse(description="The key lacks the `chat` scope, or the plan lacks the model."),
            404: OpenApiResponse(description="No such model (`model_not_found`)."),
            429: OpenApiResponse(description="Rate limit or quota reached; see Retry-After."),
            503: OpenApiResponse(description="The model is at capacity."),
        },
    )
    def post(self, request: Request) -> Response:  # pragma: no cover
        raise exceptions.MethodNotAllowed("POST")


chat_completions.cls = ChatCompletionApi
chat_completions.initkwargs = {}


class ModelListApi(APIView):
    """GET /v1/models: the models the caller's plan includes."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "models:read"

    class OutputSerializer(serializers.Serializer):
        id = serializers.CharField(source="name")
        object = serializers.SerializerMethodField()
        created = serializers.SerializerMethodField()
        owned_by = serializers.SerializerMethodField()

        def get_object(self, deployment) -> str:
            return "model"

        def get_created(self, deployment) -> int:
            return int(deployment.created_at.timestamp())

        def get_owned_by(self, deployment) -> str:
            return "chatsite"

    @extend_schema(
        responses=inline_serializer(
            "ModelList", {"object": serializers.CharField(), "data": OutputSerializer(many=True)}
        ),
        summary="List the models your plan includes",
    )
    def get(self, request: Request) -> Response:
        from accounts.selectors import deployments_allowed_for_user
        from accounts.services import action_admit
        from inference.selectors import deployment_list_enabled

        action_admit(user=request.user, action="model_list")
        enabled = deployment_list_enabled(task=None)  # embedding models too
        deployments = deployments_allowed_for_user(user=request.user, deployments=enabled)
        data = self.OutputSerializer(deployments, many=True).data
        return Response({"object": "list", "data": data})
