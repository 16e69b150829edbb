from django.contrib.auth.views import LoginView
from django.urls import include, path
from oauth2_provider import views as oauth2_views

from tests.helpers.oidc_provider.people import GitHubEmails, GitHubUser

urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("login/", LoginView.as_view(), name="login"),
    # GitHub's endpoints, where its preset looks for them on a GitHub Enterprise Server.
    path("login/oauth/authorize", oauth2_views.AuthorizationView.as_view()),
    path("login/oauth/access_token", oauth2_views.TokenView.as_view()),
    path("api/v3/user", GitHubUser.as_view()),
    path("api/v3/user/emails", GitHubEmails.as_view()),
]
