"""Leaving with your data: the archive of everything the service holds about a person, where they are
signed in (and signing out everywhere else), and deleting the account for good."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from django.contrib.sessions.models import Session
from django.db.models.signals import pre_delete
from django.test import Client
from django.urls import reverse

from accounts.models import ApiKey, SignedInSession, User
from accounts.services import api_key_create, user_delete
from billing.models import UsageRecord
from conversations.models import Conversation, Message
from conversations.services import conversation_create, project_create
from documents.models import Chunk, Document
from inference.models import Generation
from tests.helpers.factories import PASSWORD
from tests.helpers.sockets import ENGINE_STATUS, events_but_broadcasts, open_socket

SUSPENDED, SESSION_ENDED = 4403, 4401


def _signed_in(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def _holdings(user) -> None:
    """A conversation in a project with two versions of its answer, a file, a key and a usage record."""
    project = project_create(owner=user, name="Travel", instructions=f"Plan for {user.username}.")
    chat = conversation_create(user=user, title="Trip", project_id=project.id)
    question = Message.objects.create(conversation=chat, role="user", content=f"Where to, {user.username}?")
    Message.objects.create(conversation=chat, role="assistant", content="Oslo.", parent=question)
    Message.objects.create(conversation=chat, role="assistant", content="Lisbon.", parent=question)
    data = f"{user.username}'s notes".encode()
    Document.objects.create(
        owner=user,
        name="../notes/../../etc.txt",
        kind="text",
        size=len(data),
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        status=Document.Status.READY,
    )
    api_key_create(user=user, name="laptop", scopes=["chat"])
    UsageRecord.objects.create(user=user, status="complete", prompt_tokens=12, completion_tokens=5, cost=Decimal("0.5"))


def test_the_archive_holds_everything_of_the_persons_and_nothing_of_anothers(alice, bob):
    _holdings(alice)
    _holdings(bob)
    response = _signed_in(alice).get(reverse("accounts:export"))
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"].startswith('attachment; filename="alice-data-')
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    names = archive.namelist()
    assert all(not name.startswith("/") and ".." not in name.split("/") for name in names)

    account = json.loads(archive.read("account.json"))
    assert account["username"] == "alice" and account["email"] == "alice@example.com"
    assert [key["name"] for key in account["api_keys"]] == ["laptop"]
    assert "secret_hash" not in json.dumps(account) and len(account["sessions"]) == 1

    (conversation_file,) = [n for n in names if n.startswith("conversations/")]
    conversation = json.loads(archive.read(conversation_file))
    assert conversation["holds"] == "tree"
    assert sorted(m["content"] for m in conversation["messages"]) == ["Lisbon.", "Oslo.", "Where to, alice?"]

    (project,) = json.loads(archive.read("projects.json"))
    assert (project["name"], project["instructions"]) == ("Travel", "Plan for alice.")
    assert project["conversations"] == [conversation["id"]]

    listed = json.loads(archive.read("files.json"))
    assert [f["name"] for f in listed] == ["../notes/../../etc.txt"]
    assert listed[0]["path"].startswith("files/") and "/" not in listed[0]["path"][len("files/") :]
    assert archive.read(listed[0]["path"]) == b"alice's notes"

    usage = archive.read("usage.csv").decode().splitlines()
    assert len(usage) == 2 and usage[1].endswith(",12,0,5,0.500000")
    everything = b"".join(archive.read(name) for name in names)
    assert b"bob" not in everything


def test_the_archive_needs_a_signed_in_user(client):
    response = client.get(reverse("accounts:export"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_deleting_asks_for_the_password_and_the_tick_and_keeps_everything_when_refused(alice):
    _holdings(alice)
    client = _signed_in(alice)
    url = reverse("accounts:delete")
    assert client.get(url).status_code == 200
    wrong = client.post(url, {"password": "not it", "understood": "on"})
    assert wrong.status_code == 400 and "not your password" in wrong.content.decode()
    unticked = client.post(url, {"password": PASSWORD})
    assert unticked.status_code == 400
    assert User.objects.filter(id=alice.id).exists() and Conversation.objects.filter(user=alice).exists()
    assert client.get(reverse("accounts:settings")).status_code == 200  # still signed in


def test_guessing_the_password_to_delete_is_throttled_as_a_sign_in_is(alice):
    client = _signed_in(alice)
    statuses = [
        client.post(reverse("accounts:delete"), {"password": f"guess {i}", "understood": "on"}).status_code
        for i in range(12)
    ]
    assert statuses[0] == 400 and statuses[-1] == 429
    locked = client.post(reverse("accounts:delete"), {"password": PASSWORD, "understood": "on"})
    assert locked.status_code == 429 and User.objects.filter(id=alice.id).exists()


def test_a_deleted_account_takes_its_content_and_leaves_the_ledger_without_it(alice, bob):
    _holdings(alice)
    _holdings(bob)
    client = _signed_in(alice)
    elsewhere = _signed_in(alice)
    response = client.post(reverse("accounts:delete"), {"password": PASSWORD, "understood": "on"})
    assert response.status_code == 200 and "is deleted" in response.content.decode()

    assert not User.objects.filter(id=alice.id).exists()
    assert not Conversation.objects.filter(title="Trip", user_id=alice.id).exists()
    assert not Message.objects.filter(content__contains="alice").exists()
    assert not Document.objects.filter(owner_id=alice.id).exists() and not Chunk.objects.filter(owner_id=alice.id)
    assert not ApiKey.objects.filter(user_id=alice.id).exists()
    assert not SignedInSession.objects.filter(user_id=alice.id).exists()
    kept = UsageRecord.objects.get(former_account=alice.id)
    assert kept.user_id is None and kept.prompt_tokens == 12 and kept.cost == Decimal("0.5")
    # Both of alice's sessions are over; bob keeps everything.
    for signed_out in (client, elsewhere):
        assert signed_out.get(reverse("accounts:settings")).status_code == 302
    assert Conversation.objects.filter(user=bob).count() == 1 and Document.objects.filter(owner=bob).count() == 1
    assert UsageRecord.objects.get(user=bob).former_account is None


@pytest.mark.django_db(transaction=True)
async def test_deleting_an_account_stops_its_answers_and_closes_its_sockets(alice, default_deployment):
    socket, _ = await open_socket(alice)
    running = await Generation.objects.acreate(
        user=alice, deployment=default_deployment, prompt_token_ids=[1], sampling={}, status=Generation.Status.RUNNING
    )
    # What each generation row held as it went: its stop must have been asked for by then.
    deleted = []

    def note(sender, instance, **kwargs):
        deleted.append((instance.id, instance.stop_requested))

    pre_delete.connect(note, sender=Generation)
    try:
        await database_sync_to_async(user_delete)(user=await User.objects.aget(id=alice.id))
    finally:
        pre_delete.disconnect(note, sender=Generation)
    assert deleted == [(running.id, True)]
    output = await socket.receive_output(timeout=2)
    while output["type"] != "websocket.close":
        output = await socket.receive_output(timeout=2)
    assert output["code"] == SUSPENDED


def test_the_settings_page_lists_where_one_is_signed_in_and_signs_out_everywhere_else(alice, bob):
    here, there = _signed_in(alice), _signed_in(alice)
    bobs = _signed_in(bob)
    page = here.get(reverse("accounts:settings")).content.decode()
    assert page.count("<time datetime=") == 2 and "This browser" in page
    response = here.post(reverse("accounts:sessions_end_others"))
    assert response.status_code == 302
    assert here.get(reverse("accounts:settings")).status_code == 200
    assert there.get(reverse("accounts:settings")).status_code == 302
    assert bobs.get(reverse("accounts:settings")).status_code == 200
    assert SignedInSession.objects.filter(user=alice).count() == 1
    assert Session.objects.count() == 2  # alice's here, bob's


@pytest.mark.django_db(transaction=True)
async def test_signing_out_everywhere_else_closes_the_other_sessions_sockets(alice):
    here, there = Client(), Client()
    for client in (here, there):
        assert await database_sync_to_async(client.login)(username="alice", password=PASSWORD)
    mine, _ = await open_socket(alice, client=here)
    theirs, _ = await open_socket(alice, client=there)
    await database_sync_to_async(here.post)(reverse("accounts:sessions_end_others"))
    output = await theirs.receive_output(timeout=2)
    while output["type"] != "websocket.close":
        output = await theirs.receive_output(timeout=2)
    assert output["code"] == SESSION_ENDED
    assert (
        await events_but_broadcasts(mine, timeout=0.5, skipping=ENGINE_STATUS) == []
    )  # this session's socket stays open
