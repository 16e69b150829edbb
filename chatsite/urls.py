from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounts.metering import metered
from conversations.apis import (
    ConversationBranchApi,
    ConversationDetailApi,
    ConversationFileApi,
    ConversationListCreateApi,
    ConversationSettingsApi,
    MessageCitationsApi,
    MessageFeedbackApi,
    SavedPromptDetailApi,
    SavedPromptListCreateApi,
    conversation_start_stream,
    message_send_stream,
)
from conversations.archive_apis import ConversationArchiveApi, ConversationBulkArchiveApi, ConversationBulkDeleteApi
from conversations.project_apis import (
    ConversationProjectApi,
    ProjectDetailApi,
    ProjectFileApi,
    ProjectListCreateApi,
)
from conversations.tool_apis import generation_stop, tool_approval_create
from documents.apis import (
    DocumentDetailApi,
    DocumentImageApi,
    DocumentListCreateApi,
    DocumentSearchApi,
    DocumentThumbnailApi,
)
from inference.openai.apis import ModelListApi, chat_completions
from inference.openai.completions import completions
from inference.openai.embeddings import EmbeddingApi
from inference.openai.models import ModelDetailApi
from inference.openai.tokenize import DetokenizeApi, TokenizeApi
from moderation.apis import ModerationCreateApi
from observability.views import admin_urls, healthz, metrics_view, readyz

urlpatterns = [
    # Before the admin's own, whose catch-all would take them (staff only, docs/observability.md).
    *admin_urls(),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("accounts/", include("accounts.urls")),
    path("accounts/", include("billing.urls")),
    # OpenAI-compatible: point the openai client's base_url at http://<host>/v1
    path("v1/chat/completions", chat_completions, name="chat-completions"),
    path("v1/completions", completions, name="completions"),
    path("v1/embeddings", EmbeddingApi.as_view(), name="embeddings"),
    path("v1/models", ModelListApi.as_view(), name="models"),
    path("v1/models/<str:model_id>", ModelDetailApi.as_view(), name="model"),
    # vLLM's own endpoints, at the root as its server has them.
    path("tokenize", TokenizeApi.as_view(), name="tokenize"),
    path("detokenize", DetokenizeApi.as_view(), name="detokenize"),
    path("v1/moderations", ModerationCreateApi.as_view(), name="moderations"),
    path("api/conversations/", ConversationListCreateApi.as_view(), name="api-conversations"),
    path("api/conversations/messages/", conversation_start_stream, name="api-conversations-send-new"),
    path("api/conversations/bulk-delete/", ConversationBulkDeleteApi.as_view(), name="api-conversations-delete-many"),
    path(
        "api/conversations/bulk-archive/", ConversationBulkArchiveApi.as_view(), name="api-conversations-archive-many"
    ),
    path("api/conversations/<int:conversation_id>/", ConversationDetailApi.as_view(), name="api-conversation"),
    path("api/conversations/<int:conversation_id>/messages/", message_send_stream, name="api-conversation-send"),
    path(
        "api/conversations/<int:conversation_id>/archive/",
        ConversationArchiveApi.as_view(),
        name="api-conversation-archive",
    ),
    path(
        "api/conversations/<int:conversation_id>/branch/",
        ConversationBranchApi.as_view(),
        name="api-conversation-branch",
    ),
    path(
        "api/conversations/<int:conversation_id>/settings/",
        ConversationSettingsApi.as_view(),
        name="api-conversation-settings",
    ),
    path(
        "api/conversations/<int:conversation_id>/messages/<int:message_id>/feedback/",
        MessageFeedbackApi.as_view(),
        name="api-message-feedback",
    ),
    path(
        "api/conversations/<int:conversation_id>/files/", ConversationFileApi.as_view(), name="api-conversation-files"
    ),
    path(
        "api/conversations/<int:conversation_id>/messages/<int:message_id>/citations/",
        MessageCitationsApi.as_view(),
        name="api-message-citations",
    ),
    path(
        "api/conversations/<int:conversation_id>/tool-approvals/",
        tool_approval_create,
        name="api-conversation-tool-approvals",
    ),
    path("api/conversations/<int:conversation_id>/stop/", generation_stop, name="api-conversation-stop"),
    path(
        "api/conversations/<int:conversation_id>/project/",
        ConversationProjectApi.as_view(),
        name="api-conversation-project",
    ),
    path("api/projects/", ProjectListCreateApi.as_view(), name="api-projects"),
    path("api/projects/<int:project_id>/", ProjectDetailApi.as_view(), name="api-project"),
    path("api/projects/<int:project_id>/files/", ProjectFileApi.as_view(), name="api-project-files"),
    path("api/prompts/", SavedPromptListCreateApi.as_view(), name="api-prompts"),
    path("api/prompts/<int:prompt_id>/", SavedPromptDetailApi.as_view(), name="api-prompt"),
    path("api/files/", DocumentListCreateApi.as_view(), name="api-files"),
    path("api/files/search/", DocumentSearchApi.as_view(), name="api-files-search"),
    path("api/files/<int:document_id>/", DocumentDetailApi.as_view(), name="api-file"),
    path("api/files/<int:document_id>/image/", DocumentImageApi.as_view(), name="api-file-image"),
    path("api/files/<int:document_id>/thumbnail/", DocumentThumbnailApi.as_view(), name="api-file-thumbnail"),
    path("files/", include("documents.urls")),
    path("api/schema/", metered("request")(SpectacularAPIView.as_view()), name="schema"),
    # The split view serves Swagger UI's start-up script as a file of its own: the CSP refuses inline scripts.
    path(
        "api/docs/",
        metered("request")(SpectacularSwaggerSplitView.as_view(url_name="schema", template_name="api/swagger_ui.html")),
        name="api-docs",
    ),
    path("", include("conversations.urls")),
]

handler400 = "chatsite.errors.bad_request"
handler404 = "chatsite.errors.not_found"
handler500 = "chatsite.errors.server_error"
