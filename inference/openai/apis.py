"""The OpenAI-compatible API: /v1/chat/completions (streamed over SSE or not) and /v1/models.

Chat completions is a plain async view rather than a DRF APIView: a completion waits on the engine,
and that wait belongs on the event loop, not in a thread. It still uses DRF's pieces: the API-key
authenticator and a serializer for validation. Errors are OpenAI's shape with OpenAI's statuses,
so the official client raises its own exception types.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import ApiKeyAuthentication, HasScope, api_key_caller, signed_in
from accounts.metering import ADMITTED, metered
from accounts.selectors import deployments_allowed_for_user
from chatsite.database import db_async
from chatsite.errors import ClientError
from chatsite.parsers import request_body, validated_json_body
from inference.images import image_part_parse
from inference.openai import responding, wire
from inference.openai.fields import SamplingFieldsSerializer, StopAndStreamOptions
from inference.openai.ratelimits import with_rate_limits
from inference.openai.services import (
    completion_create_checked,
    content_text,
    images_accepted_check,
    images_read,
    newest_user_text,
)
from inference.openai.tools import (
    ToolFieldsSerializer,
    tool_call_readers,
    tool_fields_check,
    tool_message_fields,
)
from inference.selectors import deployment_list_enabled, models_listed


class ChatCompletionInputSerializer(StopAndStreamOptions, SamplingFieldsSerializer, ToolFieldsSerializer):
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

    def validate_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        cleaned = []
        for message in messages:
            role = message.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool"):
                raise serializers.ValidationError(
                    "Each message needs a role: system, developer, user, assistant or tool."
                )
            calls = tool_message_fields(message)
            content = message.get("content")
            if content is None and calls.get("tool_calls"):  # an assistant's turn that only called tools
                cleaned.append({"role": role, "content": None, **calls})
                continue
            if isinstance(content, list):  # content parts: text, and images in a user's turn
                content = _content_parts(content, role=role)
            if not isinstance(content, str | list):
                raise serializers.ValidationError(
                    "Each message's content must be a string or a list of text and image_url parts."
                )
            if "\x00" in (content if isinstance(content, str) else "".join(p.get("text", "") for p in content)):
                raise serializers.ValidationError("Message content cannot contain NUL characters.")
            cleaned.append({"role": "system" if role == "developer" else role, "content": content, **calls})
        if sum(len(content_text(m["content"])) for m in cleaned) > settings.API_MAX_PROMPT_CHARS:
            raise serializers.ValidationError(
                f"The messages are longer than {settings.API_MAX_PROMPT_CHARS} characters."
            )
        return cleaned

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        data = tool_fields_check(super().validate(data))
        # The images' sources come out of the messages, in order; each part stays as its placeholder.
        sources = [
            part.pop("source")
            for m in data["messages"]
            if isinstance(m["content"], list)
            for part in m["content"]
            if "source" in part
        ]
        if len(sources) > settings.API_MAX_IMAGES:
            raise serializers.ValidationError({"messages": f"At most {settings.API_MAX_IMAGES} images a request."})
        if sources:  # absent otherwise: a request without images is exactly what it was
            data["images"] = sources
        return data


def _content_parts(parts: list[Any], *, role: str) -> str | list[dict[str, Any]]:
    """A message's content parts: text parts joined (as before), or, where it holds images (a user's
    turn only), the parts in order, each image an `{"type": "image"}` placeholder with its source."""
    if not all(isinstance(p, dict) and p.get("type") in ("text", "image_url") for p in parts):
        raise serializers.ValidationError("Content parts must be of type text or image_url.")
    if not all(isinstance(p.get("text"), str) for p in parts if p["type"] == "text"):
        raise serializers.ValidationError("A text part needs its 'text'.")
    if not any(p["type"] == "image_url" for p in parts):
        return "".join(p["text"] for p in parts)
    if role != "user":
        raise serializers.ValidationError("Images can be sent in a user's message only.")
    try:
        return [
            {"type": "text", "text": p["text"]}
            if p["type"] == "text"
            else {"type": "image", "source": image_part_parse(p)}
            for p in parts
        ]
    except ClientError as exc:
        raise serializers.ValidationError(exc.message) from None


def _error(exc: ClientError) -> JsonResponse:
    response = JsonResponse(
        wire.error_body(message=exc.message, status=exc.status, code=exc.code, param=exc.param), status=exc.status
    )
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


@metered(ADMITTED)
@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return _error(ClientError("Use POST.", code="method_not_allowed", status=405))
    user = api_key = None
    try:
        user, api_key = await db_async(api_key_caller)(request, scope="chat")
        data = validated_json_body(request_body(request), ChatCompletionInputSerializer)
        if data.get("images"):
            # A model that takes no images is refused before any image is fetched or decoded.
            await db_async(images_accepted_check)(model=data["model"])
            data["images"] = await asyncio.to_thread(images_read, user=user, sources=data["images"])
        # Scored once the completion is committed held: the engine starts on it meanwhile.
        generations = await completion_create_checked(
            db_async, user=user, api_key=api_key, request=data, text=newest_user_text(data)
        )
    except ClientError as exc:
        return await with_rate_limits(_error(exc), user=user, api_key=api_key)
    ids = [str(g.id) for g in generations]
    include_usage = bool((data.get("stream_options") or {}).get("include_usage"))
    # Loads vLLM's parser the first time (seconds): off the event loop.
    readers = await asyncio.to_thread(tool_call_readers, data, deployment=generations[0].deployment, n=len(ids))
    # Played back from the response cache (inference.caching): said in a header and in the body.
    cached = all(g.cached for g in generations)
    # The model that writes it: the deployment its name was routed to (orchestration.routing).
    shape = responding.ChatShape(
        completion_id=f"chatcmpl-{generations[0].id.hex}",
        created=int(time.time()),
        model=generations[0].deployment.answer_model,
        include_usage=data["stream"] and include_usage,
        logprobs=data.get("logprobs") is not None,
        readers=readers,
        cached=cached,
    )
    response: HttpResponseBase
    if data["stream"]:
        response = StreamingHttpResponse(
            responding.streamed(ids, shape, include_usage=include_usage), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    else:
        response = await responding.whole(ids, shape)
    if cached:
        response["X-Cache"] = "hit"
    return await with_rate_limits(response, user=user, api_key=api_key)


class ChatCompletionApi(APIView):
    """Documentation only: the schema of `chat_completions`, which serves the requests (a plain
    async view, which drf-spectacular finds through the `cls` attribute, as the conversations API's)."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "chat"

    @extend_schema(
        operation_id="chat_completions_create",
        summary="Create a chat completion (OpenAI's format; streamed over Server-Sent Events with `stream`)",
        description="Every field is honoured or refused with a 400 naming it (`param`), but for the few that change "
        "nothing in the answer (`metadata`, `prompt_cache_key`), accepted and ignored; docs/api.md has the table.",
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


@metered("model_list")
class ModelListApi(APIView):
    """GET /v1/models: the models the caller's plan includes."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "models:read"

    class OutputSerializer(serializers.Serializer):
        """One public model name (inference.selectors.models_listed): (name, its first deployment)."""

        id = serializers.SerializerMethodField()
        object = serializers.SerializerMethodField()
        created = serializers.SerializerMethodField()
        owned_by = serializers.SerializerMethodField()

        def get_id(self, listed) -> str:
            return listed[0]

        def get_object(self, listed) -> str:
            return "model"

        def get_created(self, listed) -> int:
            return int(listed[1].created_at.timestamp())

        def get_owned_by(self, listed) -> str:
            # A name served by the scripted engine says so, as its answers' model names do.
            return "chatsite:scripted" if listed[1].engine_kind == listed[1].Engine.SCRIPTED else "chatsite"

    @extend_schema(
        responses=inline_serializer(
            "ModelList", {"object": serializers.CharField(), "data": OutputSerializer(many=True)}
        ),
        summary="List the models your plan includes",
    )
    def get(self, request: Request) -> Response:
        enabled = deployment_list_enabled(task=None)  # embedding models too
        deployments = deployments_allowed_for_user(user=signed_in(request), deployments=enabled)
        data = self.OutputSerializer(models_listed(deployments), many=True).data
        return Response({"object": "list", "data": data})
