"""A person's settings page: custom instructions, default model, theme."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings
from django.urls import reverse

from accounts.models import Tier, UserSettings
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.models import ModelDeployment


@pytest.fixture
def second_model(db):
    """A second deployment of the same model folder; the free plan may use it."""
    deployment = ModelDeployment.objects.create(name="smollm2-second", **DEFAULT_DEPLOYMENT_FIELDS)
    Tier.objects.get(name="free").deployments.add(deployment)
    return deployment


@pytest.fixture
def outside_the_plan(db):
    return ModelDeployment.objects.create(name="smollm2-pro-only", **DEFAULT_DEPLOYMENT_FIELDS)


def _form(**changes) -> dict[str, str]:
    return {"about_me": "", "answer_style": "", "default_model": "", "theme": "system", **changes}


def test_the_settings_page_needs_a_login(client, db):
    response = client.get(reverse("accounts:settings"))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_saved_settings_redirect_and_are_there_after_a_reload(client, alice, second_model):
    client.force_login(alice)
    response = client.post(
        reverse("accounts:settings"),
        _form(about_me="I teach chemistry.", answer_style="Briefly.", default_model="smollm2-second", theme="dark"),
    )
    assert response.status_code == 302 and response["Location"] == reverse("accounts:settings")
    saved = UserSettings.objects.get(user=alice)
    assert (saved.about_me, saved.answer_style, saved.default_model, saved.theme) == (
        "I teach chemistry.",
        "Briefly.",
        "smollm2-second",
        "dark",
    )
    page = client.get(reverse("accounts:settings")).content.decode()
    assert "Settings saved." in page
    assert "I teach chemistry." in page
    assert '<option value="smollm2-second" selected>' in page


def test_the_theme_is_on_the_html_element_of_every_page(client, alice):
    client.force_login(alice)
    assert '<html lang="en" data-theme="system">' in client.get(reverse("conversations:chat")).content.decode()
    client.post(reverse("accounts:settings"), _form(theme="dark"))
    for name in ("conversations:chat", "billing:usage", "accounts:api_keys", "accounts:settings"):
        assert '<html lang="en" data-theme="dark">' in client.get(reverse(name)).content.decode()
    client.logout()
    assert 'data-theme="system"' in client.get(reverse("accounts:login")).content.decode()


def test_a_default_model_outside_the_plan_is_refused(client, alice, outside_the_plan):
    client.force_login(alice)
    response = client.post(reverse("accounts:settings"), _form(default_model="smollm2-pro-only"))
    assert response.status_code == 400
    assert not UserSettings.objects.exists()
    # Not offered either: the picker lists only what the plan includes.
    assert "smollm2-pro-only" not in client.get(reverse("accounts:settings")).content.decode()


@pytest.mark.parametrize(
    "changes",
    [
        {"about_me": "x" * (UserSettings.ABOUT_MAX_CHARS + 1)},
        {"answer_style": "x" * (UserSettings.STYLE_MAX_CHARS + 1)},
        {"about_me": "nul \x00 byte"},
        {"theme": "neon"},
    ],
    ids=["about-too-long", "style-too-long", "nul", "theme"],
)
def test_bad_settings_are_refused_without_a_500(client, alice, changes):
    client.force_login(alice)
    assert client.post(reverse("accounts:settings"), _form(**changes)).status_code == 400
    assert not UserSettings.objects.exists()


def test_the_chat_page_preselects_the_default_model_and_falls_back_when_it_leaves_the_plan(client, alice, second_model):
    client.force_login(alice)
    client.post(reverse("accounts:settings"), _form(default_model="smollm2-second"))
    assert '<option value="smollm2-second" selected>' in client.get(reverse("conversations:chat")).content.decode()
    Tier.objects.get(name="free").deployments.remove(second_model)
    page = client.get(reverse("conversations:chat")).content.decode()
    assert "smollm2-second" not in page
    assert f'<option value="{settings.INFERENCE_DEFAULT_DEPLOYMENT}" selected>' in page


def test_production_hashes_passwords_with_argon2id_and_still_verifies_older_pbkdf2_hashes():
    """The suite swaps in a fast hasher (tests/conftest.py); production's list is the settings module's."""
    from django.contrib.auth.hashers import Argon2PasswordHasher, PBKDF2PasswordHasher, check_password

    from chatsite import settings as production

    assert production.PASSWORD_HASHERS[0] == "django.contrib.auth.hashers.Argon2PasswordHasher"
    assert Argon2PasswordHasher().encode("a long enough password 1", "somesaltvalue1").startswith("argon2$argon2id$")
    older = PBKDF2PasswordHasher().encode("a long enough password 1", "somesaltvalue1", iterations=1000)
    with override_settings(PASSWORD_HASHERS=production.PASSWORD_HASHERS):
        assert check_password("a long enough password 1", older)
