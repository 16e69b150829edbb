"""The test provider's people, from the JSON file OIDC_TEST_PEOPLE names (read at each use, so a
test changes them by writing it): `{"username": {"password", "email", "email_verified", "groups",
"expired", "aud"}}`."""

from __future__ import annotations

import json
import os
from datetime import timedelta

from django.contrib.auth.backends import BaseBackend
from django.contrib.auth.models import User
from django.http import JsonResponse
from django.utils import timezone
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauth2_provider.views.generic import ProtectedResourceView


def people() -> dict:
    with open(os.environ["OIDC_TEST_PEOPLE"]) as file:
        return json.load(file)


class PeopleBackend(BaseBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        person = people().get(username or "")
        if person is None or person.get("password") != password:
            return None
        user, _ = User.objects.get_or_create(username=username)
        return user

    def get_user(self, user_id):
        return User.objects.filter(id=user_id).first()


class PeopleValidator(OAuth2Validator):
    oidc_claim_scope = None  # every claim below goes into the ID token

    def get_additional_claims(self, request):
        person = people().get(request.user.username, {})
        return {
            "email": person.get("email", ""),
            "email_verified": person.get("email_verified", False),
            "preferred_username": request.user.username,
            "groups": person.get("groups", []),
        }

    def get_id_token_dictionary(self, token, token_handler, request):
        claims, expiration = super().get_id_token_dictionary(token, token_handler, request)
        person = people().get(request.user.username, {})
        if person.get("expired"):
            expired = timezone.now() - timedelta(hours=1)
            claims["exp"] = int(expired.timestamp())
        if person.get("aud"):
            claims["aud"] = person["aud"]
        return claims, expiration


class GitHubUser(ProtectedResourceView):
    """GitHub's GET /user, for the access token's person."""

    def get(self, request, *args, **kwargs):
        return JsonResponse({"id": 1000 + request.resource_owner.id, "login": request.resource_owner.username})


class GitHubEmails(ProtectedResourceView):
    """GitHub's GET /user/emails: the primary address, verified as the person's file says."""

    def get(self, request, *args, **kwargs):
        person = people().get(request.resource_owner.username, {})
        primary = {"email": person.get("email", ""), "primary": True, "verified": person.get("email_verified", False)}
        other = {"email": "other@example.net", "primary": False, "verified": True}
        return JsonResponse([other, primary], safe=False)
