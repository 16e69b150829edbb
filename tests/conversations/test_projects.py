"""Projects: a project's instructions in its chats' prompts (after the person's own, within the
window's policy), its files searched for every chat in it and no other, its default model for new
chats, moving chats in and out, deleting it with its chats or without, and owners only throughout."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.urls import reverse
from rest_framework.test import APIClient

from accounts.models import UserSettings
from chatsite.errors import ClientError
from conversations.models import Conversation, Message, Project
from conversations.prompts import Turn, assemble_prompt, project_block
from conversations.requests import SendRequest
from conversations.selectors import conversation_groups_for_user
from conversations.services import (
    ProjectChats,
    conversation_create,
    conversation_move,
    conversation_start,
    message_send,
    project_create,
    project_delete,
)
from documents.models import Document
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME
from inference.engine.tokenizers import render_chat, tokenizer_for
from tests.documents.conftest import upload_ready  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db

FACT = "The harbour master of Port Aldwin in 1903 was Eliza Quennell, who kept the tide tables."
QUESTION = "Who was the harbour master of Port Aldwin?"
INSTRUCTIONS = "Answer as a ship's log: short dated entries."


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_for(str(settings.INFERENCE_MODELS_DIR / DEFAULT_DEPLOYMENT_FIELDS["model"]))


def prompt_text(tokenizer, generation) -> str:
    return tokenizer.decode(generation.prompt_token_ids)


def send(user, content=QUESTION, **fields):
    return message_send(user=user, request=SendRequest(content=content, **fields))


# --- the prompt -------------------------------------------------------------------------------------


def test_a_projects_instructions_follow_the_persons_own_in_the_system_turn(alice, tokenizer):
    UserSettings.objects.create(user=alice, about_me="I sail a small ketch.")
    project = project_create(owner=alice, name="Voyage log", instructions=INSTRUCTIONS)
    sent = send(alice, content="Note today's weather.", project_id=project.id)
    assert sent.conversation.project_id == project.id
    text = prompt_text(tokenizer, sent.generation)
    system = text[: text.index("Note today's weather.")]
    assert system.index("I sail a small ketch.") < system.index('project "Voyage log"') < system.index(INSTRUCTIONS)
    # A chat outside the project does not carry them; one moved in does from its next message.
    outside = send(alice, content="Note today's weather.")
    assert INSTRUCTIONS not in prompt_text(tokenizer, outside.generation)
    Message.objects.filter(conversation=outside.conversation).update(status=Message.Status.COMPLETE)
    conversation_move(conversation=outside.conversation, project=project)
    again = send(alice, content="And tomorrow's?", conversation_id=outside.conversation.id)
    assert INSTRUCTIONS in prompt_text(tokenizer, again.generation)


def test_a_projects_instructions_count_against_the_window_and_give_way_whole(tokenizer):
    def assemble(*, window, project_instructions, instructions="Call me Ishmael."):
        return assemble_prompt(
            system_prompt="You are a helpful assistant.",
            instructions=instructions,
            project_instructions=project_block("Long project", project_instructions),
            turns=[Turn(role="user", content="Hello?", token_count=3)],
            render=lambda messages: render_chat(tokenizer, messages),
            max_context=window,
            max_output=64,
            min_output=16,
        )

    short = assemble(window=2048, project_instructions=INSTRUCTIONS)
    assert short.instructions_kept and short.project_instructions_kept
    assert INSTRUCTIONS in tokenizer.decode(short.token_ids)
    # Too long for what the window leaves beside the message and the answer's room: left out whole,
    # never cut, while the person's shorter instructions before it stay.
    long = " ".join(f"rule{i}" for i in range(400))
    cut = assemble(window=512, project_instructions=long)
    text = tokenizer.decode(cut.token_ids)
    assert cut.instructions_kept and not cut.project_instructions_kept
    assert "Call me Ishmael." in text and "rule0" not in text
    assert len(cut.token_ids) + cut.max_tokens <= 512
    # They take their room from the history as the person's instructions do: same window, fewer tokens free.
    assert len(short.token_ids) > len(assemble(window=2048, project_instructions="").token_ids)


# --- files --------------------------------------------------------------------------------------------


def test_a_projects_files_serve_every_chat_in_it_and_no_other(alice, tokenizer, upload_ready):  # noqa: F811
    project = project_create(owner=alice, name="Harbour")
    document = upload_ready(alice, "harbour.md", f"# Harbour history\n\n{FACT}", project_id=project.id)
    assert document.project_id == project.id and not document.library
    first = send(alice, project_id=project.id)
    assert FACT in prompt_text(tokenizer, first.generation)
    outside = conversation_start(user=alice)
    assert FACT not in prompt_text(tokenizer, send(alice, conversation_id=outside.id).generation)
    Message.objects.update(status=Message.Status.COMPLETE)
    conversation_move(conversation=outside, project=project)
    assert FACT in prompt_text(tokenizer, send(alice, conversation_id=outside.id).generation)
    Message.objects.update(status=Message.Status.COMPLETE)
    conversation_move(conversation=outside, project=None)
    assert FACT not in prompt_text(tokenizer, send(alice, conversation_id=outside.id).generation)


def test_another_persons_project_files_never_reach_a_prompt(alice, mallory, tokenizer, upload_ready):  # noqa: F811
    project = project_create(owner=alice, name="Harbour")
    upload_ready(alice, "harbour.md", f"# Harbour history\n\n{FACT}", project_id=project.id)
    with pytest.raises(ClientError) as refused:
        send(mallory, project_id=project.id)
    assert refused.value.status == 404
    assert not Conversation.objects.filter(user=mallory).exists()


# --- the default model, the list, moving -------------------------------------------------------------


def test_a_new_chat_in_a_project_starts_on_its_default_model_unless_another_is_picked(alice):
    project = project_create(owner=alice, name="Routed", default_model="auto")
    assert send(alice, project_id=project.id).conversation.model == "auto"
    picked = send(alice, project_id=project.id, model=DEFAULT_DEPLOYMENT_NAME).conversation
    assert picked.model == DEFAULT_DEPLOYMENT_NAME and picked.project_id == project.id
    with pytest.raises(ClientError) as refused:
        project_create(owner=alice, name="Nope", default_model="no-such-model")
    assert refused.value.param == "default_model"


def test_a_project_chat_is_listed_under_its_project_and_found_by_search(alice):
    project = project_create(owner=alice, name="Garden")
    inside = conversation_create(user=alice, title="Tomatoes", project_id=project.id)
    outside = conversation_create(user=alice, title="Tomato soup")
    listed = [c.id for g in conversation_groups_for_user(user=alice) for c in g.conversations]
    assert listed == [outside.id]
    found = {c.id for g in conversation_groups_for_user(user=alice, query="tomato") for c in g.conversations}
    assert found == {inside.id, outside.id}


def test_a_project_or_a_chat_within_it_cannot_be_given_with_an_existing_conversation(alice):
    project = project_create(owner=alice, name="P")
    conversation = conversation_create(user=alice)
    with pytest.raises(ClientError) as refused:
        SendRequest.parse({"content": "Hi", "conversation": conversation.id, "project": project.id})
    assert refused.value.param == "project"
    with pytest.raises(ClientError):
        SendRequest.parse({"content": "Hi", "project": "1"})


# --- deleting ----------------------------------------------------------------------------------------


def test_deleting_a_project_keeps_or_deletes_its_chats_as_chosen_and_takes_its_files(alice, upload_ready):  # noqa: F811
    kept_project = project_create(owner=alice, name="Keep")
    kept = conversation_create(user=alice, project_id=kept_project.id)
    upload_ready(alice, "notes.md", "# Notes\n\nA note.", project_id=kept_project.id)
    assert project_delete(project=kept_project, chats=ProjectChats.KEEP) == 1
    kept.refresh_from_db()
    assert kept.project_id is None and not Document.objects.exists()

    gone_project = project_create(owner=alice, name="Gone")
    gone = conversation_create(user=alice, project_id=gone_project.id)
    project_delete(project=gone_project, chats=ProjectChats.DELETE)
    assert not Conversation.objects.filter(id=gone.id).exists()
    assert not Project.objects.exists()


def api_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_deleting_a_project_without_a_valid_choice_is_refused_and_changes_nothing(alice):
    project = project_create(owner=alice, name="Undecided")
    chat = conversation_create(user=alice, project_id=project.id)
    client = api_for(alice)
    for query in ("", "?chats=", "?chats=both", "?chats=DELETE"):
        response = client.delete(f"/api/projects/{project.id}/{query}")
        assert response.status_code == 400, query
        assert response.json()["error"]["param"] == "chats"
    chat.refresh_from_db()
    assert chat.project_id == project.id and Project.objects.filter(id=project.id).exists()
    assert client.delete(f"/api/projects/{project.id}/?chats=keep").status_code == 204
    chat.refresh_from_db()
    assert chat.project_id is None


# --- owners only -------------------------------------------------------------------------------------


def test_another_users_project_is_not_found_through_every_endpoint(client, alice, mallory):
    project = project_create(owner=alice, name="Alice's", instructions=INSTRUCTIONS)
    chat = conversation_create(user=alice, project_id=project.id)
    mallorys_own = conversation_create(user=mallory)
    api = api_for(mallory)
    url = f"/api/projects/{project.id}/"
    responses = [
        api.get(url),
        api.patch(url, {"name": "Mine now"}, format="json"),
        api.delete(f"{url}?chats=delete"),
        api.get(f"{url}files/"),
        api.post(f"{url}files/", {"file": ("a.md", b"# A\n\nB")}, format="multipart"),
        api.put(f"/api/conversations/{mallorys_own.id}/project/", {"project": project.id}, format="json"),
        api.put(f"/api/conversations/{chat.id}/project/", {"project": None}, format="json"),
    ]
    assert [r.status_code for r in responses] == [404] * len(responses)
    assert all(r.json()["error"]["code"] == "not_found" for r in responses)
    assert api.get("/api/projects/").json() == []
    client.force_login(mallory)
    assert client.get(reverse("conversations:project", args=[project.id])).status_code == 404
    assert "Alice&#x27;s" not in client.get(reverse("conversations:chat")).content.decode()
    project.refresh_from_db()
    chat.refresh_from_db()
    mallorys_own.refresh_from_db()
    assert (project.name, chat.project_id, mallorys_own.project_id) == ("Alice's", project.id, None)
    assert not Document.objects.exists()
    with pytest.raises(ClientError):
        conversation_move(conversation=mallorys_own, project=project)


def test_the_api_creates_changes_and_moves(alice):
    api = api_for(alice)
    created = api.post("/api/projects/", {"name": "  Trip  ", "instructions": INSTRUCTIONS}, format="json")
    assert created.status_code == 201
    project = created.json()
    assert (project["name"], project["instructions"], project["default_model"], project["chats"]) == (
        "Trip",
        INSTRUCTIONS,
        "",
        [],
    )
    assert api.post("/api/projects/", {"name": ""}, format="json").status_code == 400
    assert api.post("/api/projects/", {"name": 5}, format="json").status_code == 400
    assert api.patch(f"/api/projects/{project['id']}/", {"default_model": "nope"}, format="json").status_code == 400
    changed = api.patch(f"/api/projects/{project['id']}/", {"default_model": "auto"}, format="json").json()
    assert changed["default_model"] == "auto" and changed["name"] == "Trip"
    chat = conversation_create(user=alice, title="Packing")
    moved = api.put(f"/api/conversations/{chat.id}/project/", {"project": project["id"]}, format="json")
    assert moved.json() == {"id": chat.id, "project": project["id"]}
    assert [c["title"] for c in api.get(f"/api/projects/{project['id']}/").json()["chats"]] == ["Packing"]
    assert api.put(f"/api/conversations/{chat.id}/project/", {"project": "x"}, format="json").status_code == 400
    out = api.put(f"/api/conversations/{chat.id}/project/", {"project": None}, format="json")
    assert out.json()["project"] is None


def test_a_session_changes_projects_only_with_the_csrf_token(alice):
    project = project_create(owner=alice, name="Guarded")
    chat = conversation_create(user=alice)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get("/api/projects/").json()[0]["id"] == project.id
    refused = [
        client.post("/api/projects/", {"name": "Forged"}, format="json"),
        client.patch(f"/api/projects/{project.id}/", {"name": "Forged"}, format="json"),
        client.delete(f"/api/projects/{project.id}/?chats=delete"),
        client.post(f"/api/projects/{project.id}/files/", {"file": ("a.md", b"# A\n\nB")}, format="multipart"),
        client.put(f"/api/conversations/{chat.id}/project/", {"project": project.id}, format="json"),
    ]
    # DRF's session check: a 403 that names the missing token.
    assert [r.status_code for r in refused] == [403] * len(refused)
    assert all("CSRF" in r.json()["error"]["message"] for r in refused)
    chat.refresh_from_db()
    assert list(Project.objects.values_list("name", flat=True)) == ["Guarded"] and chat.project_id is None
    assert not Document.objects.exists()
    client.cookies["csrftoken"] = TOKEN
    moved = client.put(
        f"/api/conversations/{chat.id}/project/", {"project": project.id}, format="json", HTTP_X_CSRFTOKEN=TOKEN
    )
    assert moved.status_code == 200 and moved.json()["project"] == project.id


TOKEN = "a" * 32
