"""The test identity provider's own settings: nothing of the service's."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECRET_KEY = "test-identity-provider-" + "x" * 32
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.helpers.oidc_provider.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["OIDC_TEST_DATABASE"]}}
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [HERE / "templates"]}]
AUTHENTICATION_BACKENDS = ["tests.helpers.oidc_provider.people.PeopleBackend"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_URL = "/login/"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": os.environ["OIDC_TEST_RSA_KEY"],
    "OAUTH2_VALIDATOR_CLASS": "tests.helpers.oidc_provider.people.PeopleValidator",
    "PKCE_REQUIRED": True,
    "SCOPES": {
        "openid": "OpenID Connect",
        "email": "Email",
        "profile": "Profile",
        "read:user": "GitHub's profile",
        "user:email": "GitHub's addresses",
    },
}
# Cookies are shared across ports: on 127.0.0.1 beside the service, the provider's must not
# overwrite the service's session and CSRF cookies.
SESSION_COOKIE_NAME = "idp_session"
CSRF_COOKIE_NAME = "idp_csrftoken"
