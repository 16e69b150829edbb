from django.urls import path

from documents import views

app_name = "documents"

urlpatterns = [
    path("", views.library, name="library"),
    path("<int:document_id>/delete/", views.document_delete_view, name="delete"),
]
