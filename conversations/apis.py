"""The conversations REST API under /api/conversations/.

Owners only: another user's conversation answers 404 exactly like a missing one, never 403. API keys
need `conversations:read` to read, `conversations:write` to create, rename and delete, and `chat` to
send a message; session users pass every scope check.

A conversation is a tree of messages (conversations.branches): reading one returns a branch, root
first, each message with its `parent` and `siblings` (the ids of the edits or regenerations beside
it, oldest first, its own among them); `?branch=<message id>` reads the newest branch through that
message, and POST .../branch/ makes it the one shown (and continued by a send without `parent`).

Sending a message streams its answer as Server-Sent Events, so that view is a plain async view (the
wait for the engine belongs on the event loop, as for /v1/chat/completions). It authenticates by API
key or by session; a session request must carry a CSRF token, which DRF's SessionAuthentication checks.
An answer that may call the service's tools runs its tool loop in that stream (conversations.tool_streams);
its calls' approvals and Stop come as requests of their own (conversations.tool_apis).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.utils.dateparse import parse_datetime
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.apis import ScopedApi
from accounts.authentication import ApiKeyAuthentication, HasScope, signed_in
from accounts.metering import ADMITTED, metered
from accounts.models import ApiKey
from accounts.selectors import conversation_settings_limits
from chatsite.database import database_calls_concurrent, db_async
from chatsite.errors import INVALID_API_KEY, ClientError, error_body
from chatsite.parsers import request_body, validated_json_body
from conversations.citations import citation_json, citations_for_messages, cited_numbers
from conversations.images import images_shown
from conversations.models import Conversation, Message
from conversations.requests import PROMPT_TEXT_CHARS, ConversationSettingsRequest, SavedPromptRequest, SendRequest
from conversations.selectors import (
    branch_summary,
    conversation_get_for_user,
    conversation_list_for_user,
    message_branch,
    saved_prompt_get_for_user,
    saved_prompts_for_user,
)
from conversations.services import (
    conversation_branch_select,
    conversation_delete,
    conversation_rename,
    conversation_settings_update,
    conversation_start,
    message_feedback_clear,
    message_feedback_set,
    message_send_checked,
    saved_prompt_create,
    saved_prompt_delete,
    saved_prompt_update,
)
from conversations.services.feedback import FEEDBACK_COMMENT_CHARS
from conversations.tool_streams import KEEPALIVE, ToolStream
from documents.apis import DocumentOutputSerializer, FileUploadSerializer, uploaded_file
from documents.selectors import documents_of_conversation
from documents.services import document_upload
from inference.models import Generation
from inference.selectors import generation_writer
from inference.streaming.following import FOLLOW_TIMEOUT_MESSAGE, follow_streams, stopped_if_abandoned
from inference.streaming.streams import RESTARTING_MESSAGE, ServerRestarting, events_after, final_event_from_row

READ, WRITE, CHAT = ApiKey.Scope.CONVERSATIONS_READ, ApiKey.Scope.CONVERSATIONS_WRITE, ApiKey.Scope.CHAT


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of turning them into text."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class CheckedBySendField(serializers.Field):
    """A send's field passed on as it came, for `SendRequest.parse` to check exactly as it checks
    the chat socket's frame (the same refusals, in the same words)."""

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field(OpenApiTypes.BOOL)
class ToolsSwitchField(CheckedBySendField):
    pass


@extend_schema_field(OpenApiTypes.STR)
class ToolNameField(CheckedBySendField):
    pass


class ConversationPagination(CursorPagination):
    """Most recently active first; `?limit=` is clamped to 1..100, and a tampered cursor is a 400."""

    page_size = 20
    max_page_size = 100
    page_size_query_param = "limit"
    ordering = ("-updated_at", "-id")

    def decode_cursor(self, request):
        try:
            cursor = super().decode_cursor(request)
        except exceptions.NotFound:
            raise _invalid_cursor() from None
        # DRF checks the offset and direction but passes the position to the query as it came:
        # anything but the `updated_at` it wrote would fail in the database.
        if cursor is not None and not _is_position(cast(str | None, cursor.position)):  # typed int, read as text
            raise _invalid_cursor()
        return cursor


def _invalid_cursor() -> ClientError:
    return ClientError("The cursor is invalid.", code="invalid_cursor", param="cursor")


def _is_position(position: str | None) -> bool:
    """None (the first page) or an aware datetime, as the paginator writes `updated_at`."""
    if position is None:
        return True
    try:
        moment = parse_datetime(position)
    except ValueError:  # well-formed but impossible, such as month 13
        return False
    return moment is not None and moment.tzinfo is not None


def _get_or_404(request: Request, conversation_id: int) -> Conversation:
    conversation = conversation_get_for_user(user=signed_in(request), conversation_id=conversation_id)
    if conversation is None:
        raise ClientError("That conversation does not exist.", code="not_found", status=404)
    return conversation


class ConversationOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    title = serializers.CharField()
    model = serializers.CharField(help_text="The model its messages are routed by (a public name, or auto).")
    project = serializers.IntegerField(
        source="project_id", allow_null=True, help_text="The project it is in (/api/projects/), or null."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    archived_at = serializers.DateTimeField(
        allow_null=True, help_text="When it was archived (out of the list, in the Archived view); null if it is not."
    )


class MessageOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    role = serializers.CharField()
    content = serializers.CharField()
    status = serializers.CharField()
    finish_reason = serializers.CharField()
    token_count = serializers.IntegerField()
    # A declared field is taken off the class (DRF's metaclass); the stubs see it shadow Field.parent.
    parent = serializers.IntegerField(source="parent_id", allow_null=True)  # type: ignore[assignment]
    siblings = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="The ids of this message and the edits or regenerations beside it, oldest first.",
    )
    model = serializers.SerializerMethodField(help_text="An answer's: the deployment that wrote it.")
    created_at = serializers.DateTimeField()
    citations = serializers.SerializerMethodField(
        help_text="An answer's sources: the passages of your files its prompt quoted ({number, file, page, "
        "heading, passage}, `cited` where the answer's text cites it as [number]), and any the prompt-injection check "
        "left out (`withheld`)."
    )

    images = serializers.SerializerMethodField(
        help_text="A user message's images: {id, name, thumbnail_url, image_url, ocr_text, ocr_confidence, "
        "sent_as}, `sent_as` saying whether the model saw the image or the text OCR read in it."
    )

    def get_images(self, message: Message) -> list[dict[str, Any]]:
        return self.context.get("images", {}).get(message.id, []) if message.image_count else []

    def get_citations(self, message: Message) -> list[dict[str, Any]]:
        # The branch's citations, read in one query by `_with_branch`.
        cited = cited_numbers(message.content)
        return [citation_json(c, cited=cited) for c in self.context.get("citations", {}).get(message.id, [])]

    def get_model(self, message) -> str | None:
        generation = message.generation if message.role == "assistant" else None
        return generation_writer(generation) or None if generation is not None else None


class SummaryOutputSerializer(serializers.Serializer):
    text = serializers.CharField()
    through = serializers.IntegerField(source="through_id", help_text="The last message it stands for.")
    updated_at = serializers.DateTimeField()


class ConversationWithMessagesSerializer(ConversationOutputSerializer):
    messages = MessageOutputSerializer(many=True, help_text="A branch of the conversation, root first.")
    summary = SummaryOutputSerializer(
        allow_null=True,
        help_text="What the model is shown instead of the branch's messages up to `through`, once they no "
        "longer fit its window; null while everything fits (or no summary is ready yet).",
    )

    class Meta:
        ref_name = "ConversationWithMessages"


def _with_branch(conversation: Conversation, through: Any = None) -> dict[str, Any]:
    branch = message_branch(conversation=conversation, through=through)
    if branch is None:
        raise ClientError("That message is not in this conversation.", code="invalid_message", param="branch")
    sources = citations_for_messages(owner_id=conversation.user_id, message_ids=[m.id for m in branch.messages])
    with_images = [m.id for m in branch.messages if m.image_count]
    images = images_shown(message_ids=with_images) if with_images else {}
    messages = MessageOutputSerializer(
        branch.messages, many=True, context={"citations": sources, "images": images}
    ).data
    summary = branch_summary(conversation=conversation, messages=branch.messages)
    return {
        **ConversationOutputSerializer(conversation).data,
        "messages": messages,
        "summary": SummaryOutputSerializer(summary).data if summary is not None else None,
    }


@metered("request", POST=ADMITTED)
class ConversationListCreateApi(ScopedApi):
    """GET lists the caller's conversations (cursor-paginated): those in their list, or with
    `?archived=true` those archived; POST creates an empty one."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "POST": WRITE}
    pagination_class = ConversationPagination

    class InputSerializer(serializers.Serializer):
        title = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
        model = StrictCharField(max_length=100, required=False, allow_null=True, default=None)

    OutputSerializer = ConversationOutputSerializer

    @extend_schema(
        operation_id="conversations_list",
        summary="List your conversations, most recently active first",
        parameters=[
            OpenApiParameter("cursor", OpenApiTypes.STR, description="The `next` or `previous` cursor of a page."),
            OpenApiParameter("limit", OpenApiTypes.INT, description="Page size, 1 to 100 (default 20)."),
            OpenApiParameter(
                "archived",
                OpenApiTypes.STR,
                enum=["false", "true"],
                description="`true`: the archived conversations only; `false` (the default): the others.",
            ),
        ],
        responses=inline_serializer(
            "ConversationPage",
            {
                "next": serializers.URLField(allow_null=True),
                "previous": serializers.URLField(allow_null=True),
                "results": ConversationOutputSerializer(many=True),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        archived = request.query_params.get("archived", "false")
        if archived not in ("true", "false"):
            raise ClientError("'archived' must be true or false.", code="invalid_request", param="archived")
        conversations = conversation_list_for_user(user=signed_in(request), archived=archived == "true")
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(conversations, request, view=self)
        return paginator.get_paginated_response(self.OutputSerializer(page, many=True).data)

    @extend_schema(
        operation_id="conversations_create",
        summary="Start an empty conversation",
        request=InputSerializer,
        responses={201: ConversationOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        conversation = conversation_start(user=signed_in(request), **serializer.validated_data)
        return Response(self.OutputSerializer(conversation).data, status=status.HTTP_201_CREATED)


@metered("request")
class ConversationDetailApi(ScopedApi):
    """GET one conversation with its messages; PATCH renames it; DELETE removes it (stopping its answer)."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "PATCH": WRITE, "DELETE": WRITE}

    class InputSerializer(serializers.Serializer):
        title = StrictCharField(max_length=200)

    OutputSerializer = ConversationWithMessagesSerializer

    @extend_schema(
        operation_id="conversations_retrieve",
        summary="A conversation with the messages of one branch",
        parameters=[
            OpenApiParameter(
                "branch",
                OpenApiTypes.INT,
                description="A message id: the newest branch through it. Left out, the branch shown last.",
            )
        ],
        responses={
            200: OutputSerializer,
            400: OpenApiResponse(description="`branch` names no message of this conversation."),
            404: OpenApiResponse(description="No such conversation of yours."),
        },
    )
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = _get_or_404(request, conversation_id)
        asked = request.query_params.get("branch")
        through = None
        if asked is not None:
            through = int(asked) if asked.isascii() and asked.isdigit() and len(asked) < 19 else -1
        return Response(_with_branch(conversation, through))

    @extend_schema(
        operation_id="conversations_rename",
        summary="Rename a conversation",
        request=InputSerializer,
        responses={200: ConversationOutputSerializer, 404: OpenApiResponse(description="No such conversation.")},
    )
    def patch(self, request: Request, conversation_id: int) -> Response:
        conversation = _get_or_404(request, conversation_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        conversation = conversation_rename(conversation=conversation, title=serializer.validated_data["title"])
        return Response(ConversationOutputSerializer(conversation).data)

    @extend_schema(
        operation_id="conversations_delete",
        summary="Delete a conversation and its messages",
        responses={204: None, 404: OpenApiResponse(description="No such conversation.")},
    )
    def delete(self, request: Request, conversation_id: int) -> Response:
        conversation_delete(conversation=_get_or_404(request, conversation_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


@metered("request")
class ConversationBranchApi(ScopedApi):
    """POST makes the branch through a message the one shown: the page's and this API's, and the
    one a send without `parent` continues."""

    method_scopes = {"POST": WRITE}

    class InputSerializer(serializers.Serializer):
        message = serializers.IntegerField(min_value=1, max_value=2**63 - 1)

        class Meta:
            ref_name = "BranchChoice"

    @extend_schema(
        operation_id="conversations_branch_select",
        summary="Show the newest branch through a message",
        request=InputSerializer,
        responses={
            200: ConversationWithMessagesSerializer,
            400: OpenApiResponse(description="No such message in this conversation."),
            404: OpenApiResponse(description="No such conversation."),
        },
    )
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = _get_or_404(request, conversation_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        conversation_branch_select(conversation=conversation, message_id=serializer.validated_data["message"])
        return Response(_with_branch(conversation))


class ConversationSettingsOutputSerializer(serializers.Serializer):
    system_prompt = serializers.CharField(help_text="Goes into every answer's system turn, after your instructions.")
    temperature = serializers.FloatField(allow_null=True, help_text="Its answers' temperature; null: the model's.")
    system_prompt_chars = serializers.IntegerField(help_text="The longest system prompt your plan allows.")
    temperature_min = serializers.FloatField()
    temperature_max = serializers.FloatField()


def _settings_out(request: Request, conversation: Conversation) -> dict[str, Any]:
    limits = conversation_settings_limits(user=signed_in(request))
    return {
        "system_prompt": conversation.system_prompt,
        "temperature": conversation.temperature,
        "system_prompt_chars": limits.system_prompt_chars,
        "temperature_min": limits.temperature_min,
        "temperature_max": limits.temperature_max,
    }


@metered("request")
class ConversationSettingsApi(ScopedApi):
    """GET a conversation's own settings (and the plan's limits on them); PUT replaces them: a system
    prompt for its answers and their sampling temperature, from the next answer on."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "PUT": WRITE}

    class InputSerializer(serializers.Serializer):
        # The schema's description: the body is parsed by ConversationSettingsRequest.
        system_prompt = serializers.CharField(required=False, allow_blank=True, help_text='Left out: "" (none).')
        temperature = serializers.FloatField(
            required=False, allow_null=True, help_text="Left out or null: the model's."
        )

        class Meta:
            ref_name = "ConversationSettings"

    @extend_schema(
        operation_id="conversations_settings_retrieve",
        summary="A conversation's own system prompt and temperature",
        responses={
            200: ConversationSettingsOutputSerializer,
            404: OpenApiResponse(description="No such conversation."),
        },
    )
    def get(self, request: Request, conversation_id: int) -> Response:
        return Response(_settings_out(request, _get_or_404(request, conversation_id)))

    @extend_schema(
        operation_id="conversations_settings_update",
        summary="Set a conversation's own system prompt and temperature",
        request=InputSerializer,
        responses={
            200: ConversationSettingsOutputSerializer,
            400: OpenApiResponse(description="Beyond the plan's limits (nothing is saved)."),
            404: OpenApiResponse(description="No such conversation."),
        },
    )
    def put(self, request: Request, conversation_id: int) -> Response:
        conversation = _get_or_404(request, conversation_id)
        settings_request = ConversationSettingsRequest.parse(request.data)
        conversation = conversation_settings_update(conversation=conversation, request=settings_request)
        return Response(_settings_out(request, conversation))


@metered("request")
class MessageFeedbackApi(ScopedApi):
    """PUT rates an answer of one of your conversations, up or down, with an optional comment; one
    rating per answer, replaced when sent again. DELETE takes the rating back."""

    method_scopes = {"PUT": WRITE, "DELETE": WRITE}

    class InputSerializer(serializers.Serializer):
        rating = serializers.ChoiceField(choices=["up", "down"])
        comment = StrictCharField(required=False, allow_blank=True, default="", max_length=FEEDBACK_COMMENT_CHARS)

        class Meta:
            ref_name = "MessageFeedbackInput"

    class OutputSerializer(serializers.Serializer):
        message = serializers.IntegerField(source="message_id")
        rating = serializers.CharField()
        comment = serializers.CharField()
        updated_at = serializers.DateTimeField()

        class Meta:
            ref_name = "MessageFeedback"

    @extend_schema(
        operation_id="conversations_message_feedback",
        summary="Rate an answer",
        request=InputSerializer,
        responses={
            200: OutputSerializer,
            400: OpenApiResponse(description="Invalid body."),
            404: OpenApiResponse(description="No such answer in a conversation of yours."),
        },
    )
    def put(self, request: Request, conversation_id: int, message_id: int) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        feedback = message_feedback_set(
            user=signed_in(request), conversation_id=conversation_id, message_id=message_id, **serializer.validated_data
        )
        return Response(self.OutputSerializer(feedback).data)

    @extend_schema(
        operation_id="conversations_message_feedback_clear",
        summary="Take back the rating of an answer",
        responses={
            204: OpenApiResponse(description="No rating of yours on this answer now (also when there was none)."),
            404: OpenApiResponse(description="No such answer in a conversation of yours."),
        },
    )
    def delete(self, request: Request, conversation_id: int, message_id: int) -> Response:
        message_feedback_clear(user=signed_in(request), conversation_id=conversation_id, message_id=message_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


@metered("request", POST=("file_upload", "document"))
class ConversationFileApi(ScopedApi):
    """GET lists the files attached to a conversation; POST attaches one (multipart, field `file`):
    its passages serve this conversation's messages once it is `ready` (poll /api/files/<id>/)."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "POST": WRITE}
    parser_classes = [MultiPartParser]

    @extend_schema(
        operation_id="conversations_files_list",
        summary="The files attached to a conversation",
        responses=DocumentOutputSerializer(many=True),
    )
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = _get_or_404(request, conversation_id)
        documents = documents_of_conversation(user=signed_in(request), conversation_id=conversation.id)
        return Response(DocumentOutputSerializer(documents, many=True).data)

    @extend_schema(
        operation_id="conversations_files_upload",
        summary="Attach a file to a conversation",
        request={"multipart/form-data": FileUploadSerializer},
        responses={
            201: DocumentOutputSerializer,
            400: OpenApiResponse(description="Unknown type, empty, encrypted or damaged, or over a limit."),
            404: OpenApiResponse(description="No such conversation."),
            413: OpenApiResponse(description="Larger than your plan allows."),
        },
    )
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = _get_or_404(request, conversation_id)
        name, data = uploaded_file(request, user=signed_in(request))
        document = document_upload(user=signed_in(request), name=name, data=data, conversation_id=conversation.id)
        return Response(DocumentOutputSerializer(document).data, status=status.HTTP_201_CREATED)


@metered("request")
class MessageCitationsApi(ScopedApi):
    """GET an answer's sources: every passage its prompt quoted, each `cited` or not (the chat page
    shows the cited ones under it once it has ended), and those left out of its prompt."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ}

    @extend_schema(
        operation_id="conversations_message_citations",
        summary="An answer's sources",
        responses=inline_serializer("Citations", {"citations": serializers.ListField(child=serializers.DictField())}),
    )
    def get(self, request: Request, conversation_id: int, message_id: int) -> Response:
        conversation = _get_or_404(request, conversation_id)
        message = conversation.messages.filter(id=message_id).only("id", "content").first()
        if message is None:
            raise ClientError("That message does not exist.", code="not_found", status=404)
        sources = citations_for_messages(owner_id=signed_in(request).id, message_ids=[message_id])
        cited = cited_numbers(message.content)
        return Response({"citations": [citation_json(c, cited=cited) for c in sources.get(message_id, [])]})


# --- The prompt library ----------------------------------------------------------------------------


class SavedPromptOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    command = serializers.CharField(help_text="What follows `/` in the chat page's composer.")
    text = serializers.CharField()
    updated_at = serializers.DateTimeField()

    class Meta:
        ref_name = "SavedPrompt"


class SavedPromptInputSerializer(serializers.Serializer):
    """For the schema: the body is read by `SavedPromptRequest.parse`, which holds the rules."""

    command = StrictCharField(max_length=33, help_text="1 to 32 of a-z, 0-9 and -; a leading / is dropped.")
    text = StrictCharField(max_length=PROMPT_TEXT_CHARS)

    class Meta:
        ref_name = "SavedPromptInput"


def _prompt_body(request: Request, *, current: Mapping[str, object] | None = None) -> SavedPromptRequest:
    """The body as a prompt: both fields for a new one; for a change, those given over `current`."""
    if not isinstance(request.data, Mapping):
        raise ClientError("The request body must be a JSON object.", code="invalid_request")
    body: Mapping[str, object] = request.data
    fields: dict[str, object] = {**(current or {}), **{k: body[k] for k in ("command", "text") if k in body}}
    return SavedPromptRequest.parse(fields)


@metered("request")
class SavedPromptListCreateApi(ScopedApi):
    """GET lists your saved prompts, by command; POST saves a new one (at most
    SAVED_PROMPTS_PER_USER; a command you already have is refused)."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "POST": WRITE}

    @extend_schema(
        operation_id="prompts_list", summary="Your saved prompts", responses=SavedPromptOutputSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        return Response(SavedPromptOutputSerializer(saved_prompts_for_user(user=signed_in(request)), many=True).data)

    @extend_schema(
        operation_id="prompts_create",
        summary="Save a prompt",
        request=SavedPromptInputSerializer,
        responses={
            201: SavedPromptOutputSerializer,
            400: OpenApiResponse(description="An invalid or taken command, an empty or long text, a full library."),
        },
    )
    def post(self, request: Request) -> Response:
        prompt = saved_prompt_create(user=signed_in(request), request=_prompt_body(request))
        return Response(SavedPromptOutputSerializer(prompt).data, status=status.HTTP_201_CREATED)


@metered("request")
class SavedPromptDetailApi(ScopedApi):
    """PATCH changes one of your prompts (its command, its text or both); DELETE removes it. Another
    user's prompt answers 404, as a missing one."""

    method_scopes = {"PATCH": WRITE, "DELETE": WRITE}

    @extend_schema(
        operation_id="prompts_update",
        summary="Change a saved prompt",
        request=SavedPromptInputSerializer(partial=True),
        responses={
            200: SavedPromptOutputSerializer,
            400: OpenApiResponse(description="An invalid or taken command, or an empty or long text."),
            404: OpenApiResponse(description="No such prompt of yours."),
        },
    )
    def patch(self, request: Request, prompt_id: int) -> Response:
        user = signed_in(request)
        current = saved_prompt_get_for_user(user=user, prompt_id=prompt_id)
        if current is None:
            raise ClientError("That prompt does not exist.", code="not_found", status=404)
        asked = _prompt_body(request, current={"command": current.command, "text": current.text})
        prompt = saved_prompt_update(user=user, prompt_id=prompt_id, request=asked)
        return Response(SavedPromptOutputSerializer(prompt).data)

    @extend_schema(
        operation_id="prompts_delete",
        summary="Delete a saved prompt",
        responses={204: None, 404: OpenApiResponse(description="No such prompt of yours.")},
    )
    def delete(self, request: Request, prompt_id: int) -> Response:
        saved_prompt_delete(user=signed_in(request), prompt_id=prompt_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- Sending a message: streamed over SSE ---------------------------------------------------------


class MessageSendInputSerializer(serializers.Serializer):
    content = StrictCharField(trim_whitespace=False, allow_blank=True)
    model = StrictCharField(max_length=100, required=False, allow_null=True, default=None)
    client_id = StrictCharField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Your own id for the message, a UUID: a send repeated with it is saved and answered once.",
    )
    parent = serializers.IntegerField(  # type: ignore[assignment]  # as MessageOutputSerializer.parent
        required=False,
        allow_null=True,
        min_value=1,
        max_value=2**63 - 1,
        help_text="The answer the message follows, in this conversation; null starts a new branch from the "
        "beginning. Left out: the branch shown last. A message beside an earlier one (the same parent) is an edit.",
    )
    tools = ToolsSwitchField(
        required=False,
        allow_null=True,
        default=None,
        help_text="The conversation's tools on (true) or off (false) from this message on; left out, as they are. "
        "With them on, the answer may call the service's tools (docs/tools.md).",
    )
    tool = ToolNameField(
        required=False,
        allow_null=True,
        default=None,
        help_text="The name of a tool the answer must call first, whatever the conversation's switch.",
    )


def _json_error(exc: ClientError) -> JsonResponse:
    response = JsonResponse(
        error_body(message=exc.message, status=exc.status, code=exc.code, param=exc.param), status=exc.status
    )
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


def _authenticate(request: HttpRequest) -> tuple[Any, ApiKey | None]:
    """The caller and their key (None for a session), or a 401/403 ClientError."""
    drf_request = Request(request)
    try:
        result = ApiKeyAuthentication().authenticate(drf_request) or _session(request)
    except exceptions.AuthenticationFailed as exc:
        raise ClientError(str(exc.detail), code=INVALID_API_KEY, status=401) from None
    except exceptions.PermissionDenied as exc:
        raise ClientError(str(exc.detail), code="csrf_failed", status=403) from None
    if result is None:
        raise ClientError(
            "Authenticate with 'Authorization: Bearer <key>' or a session.", code=INVALID_API_KEY, status=401
        )
    user, auth = result
    api_key = auth if isinstance(auth, ApiKey) else None
    if not user.is_active:
        raise ClientError("This account is disabled.", code="account_disabled", status=403)
    if api_key is not None and not api_key.has_scope(CHAT):
        raise ClientError("This API key does not have the 'chat' scope.", code="insufficient_scope", status=403)
    return user, api_key


def _session(request: HttpRequest) -> tuple[Any, None] | None:
    """The logged-in user, once the CSRF token checks out. DRF's check runs on the plain request: on
    a DRF Request it would parse the JSON body to look for a form token, and fail on it."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    SessionAuthentication().enforce_csrf(cast(Request, request))  # it reads only what a plain request has
    return user, None


def _send_request(request: HttpRequest) -> tuple[Any, Any, dict[str, Any]]:
    """The caller and the validated body of a send."""
    user, api_key = _authenticate(request)
    return user, api_key, validated_json_body(request_body(request), MessageSendInputSerializer)


def _database_call(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """How a streamed send reaches the database. Where calls run side by side (PostgreSQL), on the
    process's database threads (`db_async`), as the chat socket's and `/v1`'s sends do: in the
    request's own thread each open stream held a connection of its own for as long as it streamed,
    and a hundred streams took more connections than PostgreSQL allows. On SQLite, in the request's
    thread, whose connection Django's request cycle manages."""
    return db_async(fn) if database_calls_concurrent() else sync_to_async(fn)


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@metered(ADMITTED)
@csrf_exempt  # API keys carry no cookie; a session request is CSRF-checked in _authenticate
async def message_send_stream(request: HttpRequest, conversation_id: int | None = None) -> HttpResponseBase:
    """POST a message into a conversation (or, without an id, into a new one) and stream the answer."""
    if request.method != "POST":
        return _json_error(ClientError("Use POST.", code="method_not_allowed", status=405))
    try:
        user, api_key, data = await _database_call(_send_request)(request)
        send = SendRequest.parse(
            {
                **data,
                "conversation": conversation_id,
                # The model is chosen when a conversation starts; later messages keep the conversation's.
                "model": data["model"] if conversation_id is None else None,
                # A client cannot say whether a request whose answer it never heard arrived: any send
                # with an id looks for an earlier one (a query more, for clients that ask for it).
                "retry": data["client_id"] is not None,
            }
        )
        # Scored once the send has committed its answer held: the engine starts on it meanwhile.
        # Its tool loop, if the answer may call tools, is driven by this response (conversations.tool_streams).
        sent = await message_send_checked(_database_call, user=user, request=send, api_key=api_key, run_tools=True)
    except ClientError as exc:
        return _json_error(exc)
    response = StreamingHttpResponse(
        _blocked(sent) if sent.blocked else _stream(sent, user=user), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@metered(ADMITTED)
@csrf_exempt
async def conversation_start_stream(request: HttpRequest) -> HttpResponseBase:
    """POST a first message: a new conversation, its answer streamed."""
    return await message_send_stream(request, None)


async def _blocked(sent):
    """Moderation held the message back: it is saved (flagged) and no answer is coming."""
    yield sse(
        "message.blocked",
        {
            "conversation": sent.conversation.id,
            "conversation_created": sent.conversation_created,
            "user_message": sent.user_message.id,
            "message": sent.blocked_reason,
            "replayed": sent.replayed,
        },
    )


async def _stream(sent, *, user: Any = None):
    """The answer's events as server-sent events. If the response ends before the answer does (the
    client went away, or no event came for longer than an answer may take), the answer is stopped
    rather than spend the engine on nobody (`stopped_if_abandoned`). An answer that may call tools
    is followed step by step, its loop driven here (`ToolStream`)."""
    generation_id = str(sent.generation.id)
    tools = ToolStream(user=user, sent=sent) if sent.tools is not None and not sent.replayed else None
    try:
        # A tool loop's list of generations grows with its steps: all of them are stopped if abandoned.
        async with stopped_if_abandoned(tools.generations if tools else [generation_id]) as following:
            yield sse(
                "message.accepted",
                {
                    "conversation": sent.conversation.id,
                    "conversation_created": sent.conversation_created,
                    "user_message": sent.user_message.id,
                    "assistant_message": sent.assistant_message.id,
                    "generation": generation_id,
                    # The deployment its name was routed to (orchestration.routing): who writes it.
                    "model": generation_writer(sent.generation),
                    "warning": sent.warning,
                    "replayed": sent.replayed,
                    **({"tools": sent.tools.as_json()} if tools is not None else {}),
                },
            )
            final = await _final_from_row(sent) if sent.replayed else None
            if final is not None:
                yield final
            else:
                try:
                    if tools is not None:
                        async with aclosing(tools.events()) as events:
                            async for event in events:
                                yield _tool_sse(sent, event, answer_id=tools.answer_id)
                    else:
                        async with aclosing(follow_streams([generation_id])) as events:
                            async for event in events:
                                yield _answer_sse(sent, event)
                except ServerRestarting as restart:
                    # The answer runs on, on its worker: repeating the send with its client_id on
                    # another web process resumes it (replayed from the start; skip to `last_seq`).
                    # A tool loop ends here: its running calls are cancelled, as on a closed socket.
                    following.ended = True
                    current = tools.generations[-1] if tools is not None else generation_id
                    yield sse(
                        "error",
                        {
                            "code": "server_restarting",
                            "message": RESTARTING_MESSAGE,
                            "generation": current,
                            "last_seq": restart.last_seq.get(current, 0),
                        },
                    )
                    return
            following.ended = True
    except TimeoutError:
        yield sse("error", {"code": "timeout", "message": FOLLOW_TIMEOUT_MESSAGE})


async def _final_from_row(sent) -> str | None:
    """The end of a replayed send's answer, with its whole text, from its row, when the answer ended
    so long ago that its stream's buffer is gone; None while the answer runs or its buffer holds
    events (then the stream is followed as for a first send). The row is read first: an answer's end
    is recorded before it is announced, so a finished row beside an empty buffer is an answer whose
    events are gone, or that ended before it published any, and the row holds all of it."""
    generation = await Generation.objects.aget(id=sent.generation.id)
    if not generation.is_finished or await events_after(str(generation.id), 0):
        return None
    return _answer_sse(sent, final_event_from_row(generation, seq=1))


def _tool_sse(sent, event: dict[str, Any], *, answer_id: int) -> str:
    """A tool loop's event: a step's as an answer's (its `done`, the answer's message: the last
    step's), the loop's own under their frames' names (conversations.tool_loops)."""
    kind = event["type"]
    if event is KEEPALIVE:
        return ": keep-alive\n\n"
    if kind == "generation.error" and "seq" not in event:  # the loop's next step could not start
        return sse(
            "error", {"code": event.get("code"), "message": event.get("message"), "generation": event["generation"]}
        )
    if kind.startswith("generation."):
        return _answer_sse(sent, event, answer_id=answer_id)
    return sse(kind, {key: value for key, value in event.items() if key != "type"})


def _answer_sse(sent, event: dict[str, Any], *, answer_id: int | None = None) -> str:
    if event["type"] == "generation.delta":
        return sse("delta", {"seq": event["seq"], "text": event["text"]})
    if event["type"] == "generation.done":
        return sse(
            "done",
            {
                "seq": event["seq"],
                "message": answer_id or sent.assistant_message.id,
                "status": event.get("status"),
                "finish_reason": event.get("finish_reason"),
                "usage": event.get("usage") or {},
                # Set when output moderation cut the answer: the text to keep instead.
                **({"text": event["text"]} if "text" in event else {}),
            },
        )
    return sse(
        "error",
        {"seq": event["seq"], "code": event.get("code"), "message": event.get("message") or "The answer failed."},
    )


SEND_DESCRIPTION = (
    "Sends `content` into the conversation in the path, or, on /api/conversations/messages/, into a new "
    "conversation (optionally on `model`). The answer streams as `text/event-stream`: `message.accepted` "
    "{conversation, conversation_created, user_message, assistant_message, generation, warning, replayed}, then "
    "`delta` {seq, text} events, then one `done` {seq, message, status, finish_reason, usage} or `error` "
    "{code, message}; a message moderation holds back gets one `message.blocked` {conversation, "
    "conversation_created, user_message, message, replayed} instead. With `client_id` (a UUID of your own), a send "
    "repeated after a dropped connection saves, charges and generates nothing: it is answered `replayed: true` "
    "with the first send's message and its answer from the start (an answer that ended long ago comes as one "
    "`done` carrying its whole `text`). Refusals (400, 401, 403, 404, 409, 429 with Retry-After, 503) are JSON "
    "errors in OpenAI's shape before any event. With `tools` on (or a `tool` asked for), the answer may call the "
    "service's tools: `tool.calls`, `tool.approval` (answered with POST .../tool-approvals/), `tool.running`, "
    "`tool.result`, `tool.step` and `tool.stopped` events come between its steps' `delta` events (docs/tools.md)."
)
SEND_RESPONSES = {
    (200, "text/event-stream"): OpenApiResponse(
        response=OpenApiTypes.STR,
        description="The answer's events.",
        examples=[
            OpenApiExample(
                "stream",
                value='event: message.accepted\ndata: {"conversation":1,...}\n\n'
                'event: delta\ndata: {"seq":1,"text":"Hello"}\n\n'
                'event: done\ndata: {"seq":2,"finish_reason":"stop",...}\n\n',
            )
        ],
    ),
    400: OpenApiResponse(description="Invalid body, empty or too long message."),
    404: OpenApiResponse(description="No such conversation or model."),
    409: OpenApiResponse(description="An answer is still being written in this conversation."),
    429: OpenApiResponse(description="Rate limit or quota reached; see Retry-After."),
    503: OpenApiResponse(description="The model is at capacity."),
}


class MessageSendApi(APIView):
    """Documentation only: the schema of `message_send_stream`, which serves the requests.

    drf-spectacular documents DRF views; the streaming view is a plain async view, so it borrows this
    class's schema through the `cls` attribute the schema generator looks for.
    """

    permission_classes = [IsAuthenticated, HasScope]
    required_scope = CHAT

    @extend_schema(
        operation_id="conversations_messages_send",
        summary="Send a message and stream the answer (Server-Sent Events)",
        description=SEND_DESCRIPTION,
        request=MessageSendInputSerializer,
        responses=SEND_RESPONSES,
    )
    def post(self, request: Request, conversation_id: int) -> Response:  # pragma: no cover
        raise exceptions.MethodNotAllowed("POST")


class ConversationStartApi(APIView):
    """Documentation only: the schema of `conversation_start_stream`."""

    permission_classes = [IsAuthenticated, HasScope]
    required_scope = CHAT

    @extend_schema(
        operation_id="conversations_start",
        summary="Start a conversation with a message and stream the answer (Server-Sent Events)",
        description=SEND_DESCRIPTION,
        request=MessageSendInputSerializer,
        responses=SEND_RESPONSES,
    )
    def post(self, request: Request) -> Response:  # pragma: no cover
        raise exceptions.MethodNotAllowed("POST")


message_send_stream.cls = MessageSendApi
message_send_stream.initkwargs = {}
conversation_start_stream.cls = ConversationStartApi
conversation_start_stream.initkwargs = {}
