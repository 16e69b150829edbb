"""The prompt library: a user's saved prompts, through the API and the page, owners only, bad input
refused with a 400 that changes nothing, and a cap on how many one user keeps."""

from __future__ import annotations

import pytest

from accounts.models import ApiKey
from conversations.models import SavedPrompt
from conversations.requests import PROMPT_TEXT_CHARS
from conversations.services.saved_prompts import SAVED_PROMPTS_PER_USER
from tests.conversations.test_apis import client_for

pytestmark = pytest.mark.django_db


def prompts_of(user) -> list[tuple[str, str]]:
    return list(SavedPrompt.objects.filter(owner=user).values_list("command", "text"))


def test_a_prompt_is_saved_listed_changed_and_deleted(alice):
    client = client_for(alice)
    created = client.post("/api/prompts/", {"command": "/Summarize", "text": "  Summarize this:  "}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["command"] == "summarize" and created.json()["text"] == "Summarize this:"
    client.post("/api/prompts/", {"command": "eli5", "text": "Explain like I am five."}, format="json")
    assert [p["command"] for p in client.get("/api/prompts/").json()] == ["eli5", "summarize"]

    prompt_id = created.json()["id"]
    changed = client.patch(f"/api/prompts/{prompt_id}/", {"text": "Summarize in three lines:"}, format="json")
    assert changed.status_code == 200
    assert changed.json()["command"] == "summarize"  # a field left out keeps its value
    assert client.delete(f"/api/prompts/{prompt_id}/").status_code == 204
    assert prompts_of(alice) == [("eli5", "Explain like I am five.")]


def test_it_never_shows_or_changes_another_users_prompt(alice, mallory):
    alices = client_for(alice).post("/api/prompts/", {"command": "mine", "text": "Alice's"}, format="json").json()
    client = client_for(mallory)
    assert client.get("/api/prompts/").json() == []
    assert client.patch(f"/api/prompts/{alices['id']}/", {"text": "Mallory's"}, format="json").status_code == 404
    assert client.delete(f"/api/prompts/{alices['id']}/").status_code == 404
    assert client.patch(f"/api/prompts/{10**30}/", {"text": "x"}, format="json").status_code == 404
    assert prompts_of(alice) == [("mine", "Alice's")]
    # The same command is free for another user.
    assert client.post("/api/prompts/", {"command": "mine", "text": "Mallory's"}, format="json").status_code == 201


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"command": "", "text": "Hi"}, "invalid_command"),
        ({"command": "two words", "text": "Hi"}, "invalid_command"),
        ({"command": "-dash", "text": "Hi"}, "invalid_command"),
        ({"command": "x" * 33, "text": "Hi"}, "invalid_command"),
        ({"command": 5, "text": "Hi"}, "invalid_command"),
        ({"command": "ok"}, "invalid_text"),
        ({"command": "ok", "text": "   "}, "invalid_text"),
        ({"command": "ok", "text": "x" * (PROMPT_TEXT_CHARS + 1)}, "invalid_text"),
        ({"command": "ok", "text": "a\x00b"}, "invalid_text"),
        ({"command": "taken", "text": "Again"}, "duplicate_command"),
        (["command", "text"], "invalid_request"),
    ],
)
def test_bad_input_is_a_400_that_changes_nothing(alice, body, code):
    client = client_for(alice)
    client.post("/api/prompts/", {"command": "taken", "text": "First"}, format="json")
    response = client.post("/api/prompts/", body, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    taken_id = SavedPrompt.objects.get().id
    if isinstance(body, dict) and "text" in body and code != "duplicate_command":  # a change is partial
        response = client.patch(f"/api/prompts/{taken_id}/", body, format="json")
        assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert prompts_of(alice) == [("taken", "First")]


def test_renaming_onto_another_prompts_command_is_refused(alice):
    client = client_for(alice)
    client.post("/api/prompts/", {"command": "one", "text": "1"}, format="json")
    two = client.post("/api/prompts/", {"command": "two", "text": "2"}, format="json").json()
    response = client.patch(f"/api/prompts/{two['id']}/", {"command": "one"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "duplicate_command"
    assert client.patch(f"/api/prompts/{two['id']}/", {"command": "two"}, format="json").status_code == 200


def test_a_full_library_takes_no_more(alice):
    SavedPrompt.objects.bulk_create(
        SavedPrompt(owner=alice, command=f"p{i}", text="t") for i in range(SAVED_PROMPTS_PER_USER)
    )
    response = client_for(alice).post("/api/prompts/", {"command": "one-more", "text": "t"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "too_many_prompts"
    assert SavedPrompt.objects.filter(owner=alice).count() == SAVED_PROMPTS_PER_USER


def test_a_key_needs_the_conversation_scopes(alice):
    reader = client_for(alice, scopes=[ApiKey.Scope.CONVERSATIONS_READ])
    assert reader.get("/api/prompts/").status_code == 200
    assert reader.post("/api/prompts/", {"command": "a", "text": "b"}, format="json").status_code == 403
    assert not SavedPrompt.objects.exists()


def test_the_page_creates_edits_and_deletes_and_says_what_is_wrong(client, alice, mallory):
    client.force_login(alice)
    assert client.post("/prompts/", {"command": "recipe", "text": "Give me a recipe for"}).status_code == 302
    prompt = SavedPrompt.objects.get(owner=alice)
    page = client.get("/prompts/")
    assert b"/recipe" in page.content and b"Give me a recipe for" in page.content

    refused = client.post("/prompts/", {"command": "bad command", "text": "x"})
    assert refused.status_code == 400 and b"lower-case letters" in refused.content
    assert b'value="bad command"' in refused.content  # what was typed comes back to fix
    refused = client.post(f"/prompts/{prompt.id}/", {"command": "recipe", "text": ""})
    assert refused.status_code == 400 and b"cannot be empty" in refused.content

    assert client.post(f"/prompts/{prompt.id}/", {"command": "cook", "text": "A recipe:"}).status_code == 302
    assert prompts_of(alice) == [("cook", "A recipe:")]

    client.force_login(mallory)
    assert client.post(f"/prompts/{prompt.id}/", {"command": "mine", "text": "x"}).status_code == 404
    assert client.post(f"/prompts/{prompt.id}/delete/").status_code == 404
    assert b"/cook" not in client.get("/prompts/").content
    assert prompts_of(alice) == [("cook", "A recipe:")]

    client.force_login(alice)
    assert client.post(f"/prompts/{prompt.id}/delete/").status_code == 302
    assert not SavedPrompt.objects.exists()


def test_the_page_needs_a_login(client, db):
    assert client.get("/prompts/").status_code == 302
