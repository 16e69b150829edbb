from django.urls import path

from billing import views

app_name = "billing"

# Under /accounts/, beside the account's other pages.
urlpatterns = [
    path("usage/", views.usage, name="usage"),
    path("usage/statement.csv", views.usage_statement, name="usage_statement"),
]
