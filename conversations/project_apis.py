"""The projects REST API under /api/projects/, and moving a conversation into or out of one
(PUT /api/conversations/<id>/project/). The chat page's scripts use it too, with the session and its
CSRF token (static/chat/projects.js).

Owners only, as for conversations: another user's project answers 404 exactly like a missing one,
and a conversation moves only into its owner's own project. API keys need `conversations:read` to
read and `conversations:write` to change anything."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.apis import ScopedApi
from accounts.authentication import signed_in
from accounts.metering import metered
from accounts.models import ApiKey
from chatsite.errors import ClientError
from conversations.apis import StrictCharField
from conversations.models import Conversation, Project
from conversations.selectors import (
    conversation_get_for_user,
    project_chats,
    project_get_for_user,
    projects_with_chats_for_user,
)
from conversations.services import ProjectChats, conversation_move, project_create, project_delete, project_update
from documents.apis import DocumentOutputSerializer, FileUploadSerializer, uploaded_file
from documents.selectors import documents_of_project
from documents.services import document_upload

READ, WRITE = ApiKey.Scope.CONVERSATIONS_READ, ApiKey.Scope.CONVERSATIONS_WRITE


class ProjectChatSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    title = serializers.CharField(source="display_title")
    url = serializers.SerializerMethodField()

    class Meta:
        ref_name = "ProjectChat"

    def get_url(self, conversation: Conversation) -> str:
        return reverse("conversations:conversation", args=[conversation.id])


class ProjectOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    instructions = serializers.CharField()
    default_model = serializers.CharField(help_text="The model its new chats start on; empty: your own default.")
    url = serializers.SerializerMethodField(help_text="Its page.")
    chats = ProjectChatSerializer(many=True, help_text="Its conversations, most recently active first.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    class Meta:
        ref_name = "Project"

    def get_url(self, project: Project) -> str:
        return reverse("conversations:project", args=[project.id])


def _project_json(project: Project) -> dict[str, Any]:
    if not hasattr(project, "chats"):
        project.chats = project_chats(project=project)  # type: ignore[attr-defined]
    return dict(ProjectOutputSerializer(project).data)


def _project_or_404(request: Request, project_id: object) -> Project:
    project = project_get_for_user(user=signed_in(request), project_id=project_id)
    if project is None:
        raise ClientError("That project does not exist.", code="not_found", status=404)
    return project


class ProjectInputSerializer(serializers.Serializer):
    name = StrictCharField(max_length=Project.NAME_MAX_CHARS)
    instructions = StrictCharField(
        max_length=Project.INSTRUCTIONS_MAX_CHARS, required=False, allow_blank=True, trim_whitespace=False
    )
    default_model = StrictCharField(max_length=100, required=False, allow_blank=True)

    class Meta:
        ref_name = "ProjectInput"


class ProjectPatchSerializer(ProjectInputSerializer):
    name = StrictCharField(max_length=Project.NAME_MAX_CHARS, required=False)

    class Meta:
        ref_name = "ProjectPatch"


@metered("request")
class ProjectListCreateApi(ScopedApi):
    """GET lists your projects, by name, each with its chats; POST creates one."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "POST": WRITE}

    @extend_schema(
        operation_id="projects_list", summary="List your projects", responses=ProjectOutputSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        projects = projects_with_chats_for_user(user=signed_in(request))
        return Response([_project_json(p) for p in projects])

    @extend_schema(
        operation_id="projects_create",
        summary="Create a project",
        request=ProjectInputSerializer,
        responses={201: ProjectOutputSerializer, 400: OpenApiResponse(description="Invalid body.")},
    )
    def post(self, request: Request) -> Response:
        serializer = ProjectInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = project_create(owner=signed_in(request), **serializer.validated_data)
        return Response(_project_json(project), status=status.HTTP_201_CREATED)


@metered("request")
class ProjectDetailApi(ScopedApi):
    """GET one project; PATCH changes its name, instructions or default model; DELETE removes it
    with its files, and with its chats or without them, as `?chats=delete|keep` says (required)."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "PATCH": WRITE, "DELETE": WRITE}

    @extend_schema(
        operation_id="projects_retrieve",
        summary="One of your projects",
        responses={200: ProjectOutputSerializer, 404: OpenApiResponse(description="No such project of yours.")},
    )
    def get(self, request: Request, project_id: int) -> Response:
        return Response(_project_json(_project_or_404(request, project_id)))

    @extend_schema(
        operation_id="projects_update",
        summary="Change a project",
        request=ProjectPatchSerializer,
        responses={
            200: ProjectOutputSerializer,
            400: OpenApiResponse(description="Invalid body."),
            404: OpenApiResponse(description="No such project of yours."),
        },
    )
    def patch(self, request: Request, project_id: int) -> Response:
        project = _project_or_404(request, project_id)
        serializer = ProjectPatchSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response(_project_json(project_update(project=project, **serializer.validated_data)))

    @extend_schema(
        operation_id="projects_delete",
        summary="Delete a project, with its chats or keeping them",
        parameters=[
            OpenApiParameter(
                "chats",
                str,
                required=True,
                enum=[c.value for c in ProjectChats],
                description="`delete`: its chats are deleted too. `keep`: they leave the project and stay.",
            )
        ],
        responses={
            204: None,
            400: OpenApiResponse(description="`chats` is missing or not `delete` or `keep`: nothing is deleted."),
            404: OpenApiResponse(description="No such project of yours."),
        },
    )
    def delete(self, request: Request, project_id: int) -> Response:
        project = _project_or_404(request, project_id)
        project_delete(project=project, chats=ProjectChats.parse(request.query_params.get("chats")))
        return Response(status=status.HTTP_204_NO_CONTENT)


@metered("request", POST=("file_upload", "document"))
class ProjectFileApi(ScopedApi):
    """GET lists a project's files; POST uploads one (multipart, field `file`): once it is `ready`
    (poll /api/files/<id>/), its passages serve every chat in the project."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "POST": WRITE}
    parser_classes = [MultiPartParser]

    @extend_schema(
        operation_id="projects_files_list",
        summary="A project's files",
        responses={200: DocumentOutputSerializer(many=True), 404: OpenApiResponse(description="No such project.")},
    )
    def get(self, request: Request, project_id: int) -> Response:
        project = _project_or_404(request, project_id)
        documents = documents_of_project(user=signed_in(request), project_id=project.id)
        return Response(DocumentOutputSerializer(documents, many=True).data)

    @extend_schema(
        operation_id="projects_files_upload",
        summary="Add a file to a project",
        request={"multipart/form-data": FileUploadSerializer},
        responses={
            201: DocumentOutputSerializer,
            400: OpenApiResponse(description="Unknown type, empty, encrypted or damaged, or over a limit."),
            404: OpenApiResponse(description="No such project."),
            413: OpenApiResponse(description="Larger than your plan allows."),
        },
    )
    def post(self, request: Request, project_id: int) -> Response:
        project = _project_or_404(request, project_id)
        name, data = uploaded_file(request, user=signed_in(request))
        document = document_upload(user=signed_in(request), name=name, data=data, project_id=project.id)
        return Response(DocumentOutputSerializer(document).data, status=status.HTTP_201_CREATED)


class ConversationProjectSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1, max_value=2**63 - 1, allow_null=True)

    class Meta:
        ref_name = "ConversationProject"


class ConversationProjectOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    project = serializers.IntegerField(source="project_id", allow_null=True)

    class Meta:
        ref_name = "ConversationInProject"


@metered("request")
class ConversationProjectApi(ScopedApi):
    """PUT moves a conversation into one of your projects (`project`: its id) or out of any (null)."""

    method_scopes = {"PUT": WRITE}

    @extend_schema(
        operation_id="conversations_project_set",
        summary="Move a conversation into or out of a project",
        request=ConversationProjectSerializer,
        responses={
            200: ConversationProjectOutputSerializer,
            400: OpenApiResponse(description="Invalid body."),
            404: OpenApiResponse(description="No such conversation, or no such project, of yours."),
        },
    )
    def put(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_get_for_user(user=signed_in(request), conversation_id=conversation_id)
        if conversation is None:
            raise ClientError("That conversation does not exist.", code="not_found", status=404)
        serializer = ConversationProjectSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project_id = serializer.validated_data["project"]
        project = None if project_id is None else _project_or_404(request, project_id)
        conversation = conversation_move(conversation=conversation, project=project)
        return Response(ConversationProjectOutputSerializer(conversation).data)
