"""The requests a client of the conversations API sends while an answer streams: its answer to a
tool call with side effects (POST /api/conversations/<id>/tool-approvals/) and Stop (POST
/api/conversations/<id>/stop/).

An answer's tool loop runs in the response that streams it (conversations.tool_streams), which may
be held by another web process: these reach it through the channel layer and wait for its reply.
Only the conversation's owner may send them; a generation of another user, or of another
conversation, is a 404 like a missing one, and a call that is not waiting is a 409; neither
changes anything. They authenticate as a send does (an API key with the `chat` scope, or a session
with its CSRF token), and count as plain requests against the plan.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import HasScope
from accounts.metering import ADMITTED, metered, request_meter
from chatsite.database import db_async
from chatsite.errors import ClientError
from chatsite.parsers import json_parse, request_body
from conversations.apis import CHAT, _authenticate, _json_error
from conversations.requests import TOOL_DECISIONS, ToolStepRequest
from conversations.selectors import tool_step_between, tool_step_for_user
from conversations.tool_streams import tool_loop_tell
from inference.models import Generation
from inference.services import generation_request_stop
from inference.streaming.streams import stream_end_announce

NOT_WAITING = "No call of that answer is waiting for an answer."


def _step_request(request: HttpRequest, *, approval: bool) -> tuple[Any, ToolStepRequest]:
    """The caller, charged one request, and the checked body."""
    user, _ = _authenticate(request)
    request_meter(user=user, address=request.META.get("REMOTE_ADDR", "")[:64], actions=("request",))
    fields = json_parse(request_body(request))
    if not isinstance(fields, dict):
        raise ClientError("The request body must be a JSON object.", code="invalid_request")
    return user, ToolStepRequest.parse(fields, approval=approval)


def _step_between(*, user: Any, conversation_id: int, asked: ToolStepRequest) -> bool:
    """Whether the answer's rows say its step may be between its calls (`tool_step_between`); a 404
    for an answer that is not the user's, in this conversation."""
    step = tool_step_for_user(user=user, conversation_id=conversation_id, generation_id=str(asked.generation))
    if step is None:
        raise ClientError("That answer does not exist.", code="not_found", status=404, param="generation")
    return tool_step_between(step=step, call_id=asked.call)


# Each charges its one request itself, once the caller is known (a key's user, or a session's).
@metered(ADMITTED)
@csrf_exempt  # API keys carry no cookie; a session request is CSRF-checked in _authenticate
async def tool_approval_create(request: HttpRequest, conversation_id: int) -> HttpResponseBase:
    """The person's answer to a call of an answer's tool loop that waits for it."""
    if request.method != "POST":
        return _json_error(ClientError("Use POST.", code="method_not_allowed", status=405))
    try:
        user, asked = await sync_to_async(_step_request)(request, approval=True)
        generation_id = str(asked.generation)
        between = await db_async(_step_between)(user=user, conversation_id=conversation_id, asked=asked)
        message = {"type": "tool.approve", "generation": generation_id, "call": asked.call, "decision": asked.decision}
        if not between or not await tool_loop_tell(generation_id=generation_id, message=message):
            raise ClientError(NOT_WAITING, code="not_waiting", status=409, param="call")
    except ClientError as exc:
        return _json_error(exc)
    return JsonResponse({"generation": generation_id, "call": asked.call, "decision": asked.decision})


@metered(ADMITTED)
@csrf_exempt
async def generation_stop(request: HttpRequest, conversation_id: int) -> HttpResponseBase:
    """Stop an answer: its step being written, or its tool calls running or waiting (then the answer
    ends there, its stream with `tool.stopped`), as the chat page's Stop does."""
    if request.method != "POST":
        return _json_error(ClientError("Use POST.", code="method_not_allowed", status=405))
    try:
        user, asked = await sync_to_async(_step_request)(request, approval=False)
        generation_id = str(asked.generation)
        between = await db_async(_step_between)(user=user, conversation_id=conversation_id, asked=asked)
        stopped = between and await tool_loop_tell(
            generation_id=generation_id, message={"type": "tool.stop", "generation": generation_id}
        )
        if not stopped:
            generation = await Generation.objects.aget(id=generation_id)
            if generation.is_finished:
                raise ClientError("That answer is not being written.", code="not_running", status=409)
            ended = await db_async(generation_request_stop)(generation=generation)
            if ended is not None:
                # No engine had it yet, so no runner will announce the end: announce it to its followers.
                await stream_end_announce(ended)
    except ClientError as exc:
        return _json_error(exc)
    return JsonResponse({"generation": generation_id, "stopped": True})


class ToolApprovalApi(APIView):
    """Documentation only: the schema of `tool_approval_create` (as `MessageSendApi` is the send's)."""

    permission_classes = [IsAuthenticated, HasScope]
    required_scope = CHAT

    @extend_schema(
        operation_id="conversations_tool_approvals_create",
        summary="Answer a tool call that waits for your approval",
        description="While a send's stream waits after a `tool.approval` event, allow the call `once`, for the "
        "rest of the `chat`, or `deny` it (the model is told you refused). Unanswered, it is refused after "
        "TOOLS_APPROVAL_TIMEOUT_S.",
        request=inline_serializer(
            "ToolApprovalInput",
            {
                "generation": serializers.UUIDField(help_text="The `generation` of the `tool.approval` event."),
                "call": serializers.CharField(help_text="The id of its `call`."),
                "decision": serializers.ChoiceField(choices=TOOL_DECISIONS),
            },
        ),
        responses={
            200: inline_serializer(
                "ToolApprovalOutput",
                {
                    "generation": serializers.UUIDField(),
                    "call": serializers.CharField(),
                    "decision": serializers.CharField(),
                },
            ),
            400: OpenApiResponse(description="An invalid body."),
            404: OpenApiResponse(description="No such answer in this conversation of yours."),
            409: OpenApiResponse(description="That call is not waiting for an answer."),
        },
    )
    def post(self, request: Request, conversation_id: int) -> Response:  # pragma: no cover
        raise exceptions.MethodNotAllowed("POST")


class GenerationStopApi(APIView):
    """Documentation only: the schema of `generation_stop`."""

    permission_classes = [IsAuthenticated, HasScope]
    required_scope = CHAT

    @extend_schema(
        operation_id="conversations_stop",
        summary="Stop an answer being written, or its tool calls",
        description="The answer's stream ends as the chat page's Stop ends it: a `done` with status `stopped`, "
        "or `tool.stopped` when its tool calls were running or waiting.",
        request=inline_serializer("StopInput", {"generation": serializers.UUIDField()}),
        responses={
            200: inline_serializer(
                "StopOutput", {"generation": serializers.UUIDField(), "stopped": serializers.BooleanField()}
            ),
            400: OpenApiResponse(description="An invalid body."),
            404: OpenApiResponse(description="No such answer in this conversation of yours."),
            409: OpenApiResponse(description="That answer is not being written."),
        },
    )
    def post(self, request: Request, conversation_id: int) -> Response:  # pragma: no cover
        raise exceptions.MethodNotAllowed("POST")


tool_approval_create.cls = ToolApprovalApi
tool_approval_create.initkwargs = {}
generation_stop.cls = GenerationStopApi
generation_stop.initkwargs = {}
