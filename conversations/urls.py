from django.urls import path

from conversations import views

app_name = "conversations"

urlpatterns = [
    path("", views.chat, name="chat"),
    path("c/<int:conversation_id>/", views.chat, name="conversation"),
    path("c/<int:conversation_id>/delete/", views.conversation_delete_view, name="delete"),
]
