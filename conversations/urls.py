from django.urls import path

from conversations import views

app_name = "conversations"

urlpatterns = [
    path("", views.chat, name="chat"),
    path("search/", views.conversation_search_view, name="search"),
    path("c/<int:conversation_id>/", views.chat, name="conversation"),
    path("c/<int:conversation_id>/delete/", views.conversation_delete_view, name="delete"),
    path("c/<int:conversation_id>/rename/", views.conversation_rename_view, name="rename"),
    path("c/<int:conversation_id>/pin/", views.conversation_pin_view, name="pin"),
    path("c/<int:conversation_id>/export.md", views.conversation_export_markdown, name="export-markdown"),
    path("c/<int:conversation_id>/export.json", views.conversation_export_json, name="export-json"),
    path("c/<int:conversation_id>/share/", views.conversation_share_view, name="share"),
    path("c/<int:conversation_id>/share/revoke/", views.conversation_share_revoke_view, name="share-revoke"),
    path("p/<int:project_id>/", views.project_page, name="project"),
    path("prompts/", views.saved_prompts_view, name="prompts"),
    path("prompts/<int:prompt_id>/", views.saved_prompt_edit_view, name="prompt-edit"),
    path("prompts/<int:prompt_id>/delete/", views.saved_prompt_delete_view, name="prompt-delete"),
    path("s/<str:token>/", views.shared_conversation, name="shared"),
]
