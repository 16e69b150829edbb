"""Archiving a conversation, and deleting or archiving several at once: owners only, all or none,
and a refused request changes nothing."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from conversations.models import Conversation, Message
from conversations.requests import SendRequest
from conversations.selectors import conversation_groups_for_user
from conversations.services import conversation_archive, conversation_create, message_send
from inference.models import Generation
from tests.conversations.test_apis import client_for, conversation_with_messages


def archive_url(conversation_id: int) -> str:
    return f"/api/conversations/{conversation_id}/archive/"


DELETE_MANY = "/api/conversations/bulk-delete/"
ARCHIVE_MANY = "/api/conversations/bulk-archive/"


def listed(user) -> list[int]:
    return [c.id for group in conversation_groups_for_user(user=user) for c in group.conversations]


def test_an_archived_chat_leaves_the_list_and_search_and_comes_back_where_its_time_puts_it(alice):
    older = conversation_with_messages(alice, title="Lighthouse keeping")
    Conversation.objects.filter(id=older.id).update(updated_at=timezone.now() - dt.timedelta(days=3))
    newer = conversation_create(user=alice, title="Groceries")
    before = Conversation.objects.get(id=older.id).updated_at
    client = client_for(alice)

    response = client.post(archive_url(older.id))
    assert response.status_code == 200 and response.json()["archived_at"] is not None
    assert listed(alice) == [newer.id]
    assert conversation_groups_for_user(user=alice, query="lighthouse") == []
    assert [c["id"] for c in client.get("/api/conversations/").json()["results"]] == [newer.id]
    archived = client.get("/api/conversations/", {"archived": "true"}).json()["results"]
    assert [c["id"] for c in archived] == [older.id]
    # Archiving again keeps the first time; archiving moves nothing in time.
    first = archived[0]["archived_at"]
    assert client.post(archive_url(older.id)).json()["archived_at"] == first
    assert Conversation.objects.get(id=older.id).updated_at == before

    response = client.delete(archive_url(older.id))
    assert response.status_code == 200 and response.json()["archived_at"] is None
    assert listed(alice) == [newer.id, older.id]
    assert [g.label for g in conversation_groups_for_user(user=alice, query="lighthouse")] == ["Previous 7 days"]


def test_an_archived_chat_still_opens_and_a_message_sent_in_it_leaves_it_archived(client, alice):
    chat = conversation_with_messages(alice, title="Kept aside")
    conversation_archive(user=alice, conversation_id=chat.id)
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[chat.id])).content.decode()
    assert "Kept aside" in page and "Hello." in page
    assert f'data-conversation="{chat.id}" data-pinned' not in page  # not in the sidebar's list
    message_send(user=alice, request=SendRequest(content="One more thing", conversation_id=chat.id))
    chat.refresh_from_db()
    assert chat.is_archived and chat.messages.count() == 4
    assert chat.id not in listed(alice)


def test_deleting_several_deletes_them_all_in_one_request_and_stops_their_answers(alice):
    first, second, kept = (conversation_with_messages(alice, title=t) for t in ("One", "Two", "Kept"))
    sent = message_send(user=alice, request=SendRequest(content="Still answering?", conversation_id=second.id))
    response = client_for(alice).post(DELETE_MANY, {"ids": [second.id, first.id, first.id]}, format="json")
    assert response.status_code == 200 and response.json() == {"deleted": sorted([first.id, second.id])}
    assert list(Conversation.objects.values_list("id", flat=True)) == [kept.id]
    assert Message.objects.count() == 2
    assert Generation.objects.get(id=sent.generation.id).stop_requested


def test_archiving_several_archives_them_all(alice):
    first, second = conversation_with_messages(alice, title="One"), conversation_with_messages(alice, title="Two")
    conversation_archive(user=alice, conversation_id=first.id)
    archived_at = Conversation.objects.get(id=first.id).archived_at
    response = client_for(alice).post(ARCHIVE_MANY, {"ids": [first.id, second.id]}, format="json")
    assert response.status_code == 200 and response.json() == {"archived": [first.id, second.id]}
    assert listed(alice) == []
    assert Conversation.objects.get(id=first.id).archived_at == archived_at


@pytest.mark.parametrize("url", [DELETE_MANY, ARCHIVE_MANY])
def test_a_batch_with_one_conversation_not_mine_is_refused_whole_without_saying_which(alice, mallory, url):
    alices = conversation_with_messages(alice, title="Alice's")
    mine = conversation_with_messages(mallory, title="Mallory's")
    client = client_for(mallory)
    answers = [
        client.post(url, {"ids": [mine.id, alices.id]}, format="json"),
        client.post(url, {"ids": [mine.id, 10**9]}, format="json"),
    ]
    assert [r.status_code for r in answers] == [404, 404]
    assert answers[0].json() == answers[1].json()  # another's id reads as a missing one
    assert answers[0].json()["error"]["code"] == "not_found"
    assert Conversation.objects.filter(archived_at__isnull=True).count() == 2
    assert Message.objects.count() == 4


@pytest.mark.parametrize(
    "body",
    [
        {"ids": []},
        {"ids": ["1"]},
        {"ids": [1.0]},
        {"ids": [True]},
        {"ids": [None]},
        {"ids": [[1]]},
        {"ids": [0]},
        {"ids": [-1]},
        {"ids": [2**63]},
        {"ids": 1},
        {"ids": "1,2"},
        {"ids": list(range(1, 102))},
        {},
        [1],
    ],
)
@pytest.mark.parametrize("url", [DELETE_MANY, ARCHIVE_MANY])
def test_ids_that_are_not_a_list_of_conversation_ids_are_refused_and_change_nothing(alice, url, body):
    chat = conversation_with_messages(alice)
    if isinstance(body, dict) and body.get("ids") == ["1"]:
        body = {"ids": [chat.id, str(chat.id)]}  # one of them valid: still nothing happens
    response = client_for(alice).post(url, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert Conversation.objects.filter(id=chat.id, archived_at__isnull=True).exists()


def test_a_bad_archived_filter_is_refused(alice):
    response = client_for(alice).get("/api/conversations/", {"archived": "yes"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "archived"


def test_another_users_chat_cannot_be_archived_or_unarchived(alice, mallory):
    chat = conversation_with_messages(alice)
    client = client_for(mallory)
    assert client.post(archive_url(chat.id)).status_code == 404
    conversation_archive(user=alice, conversation_id=chat.id)
    archived_at = Conversation.objects.get(id=chat.id).archived_at
    assert client.delete(archive_url(chat.id)).status_code == 404
    assert Conversation.objects.get(id=chat.id).archived_at == archived_at
    assert client.get("/api/conversations/", {"archived": "true"}).json()["results"] == []
    for missing in (999, 2**70):
        assert client_for(alice).post(archive_url(missing)).status_code == 404


def test_each_new_endpoint_needs_the_write_scope_and_a_session_needs_the_csrf_token(alice):
    chat = conversation_with_messages(alice)
    reader = client_for(alice, scopes=["conversations:read"])
    refused = [
        reader.post(archive_url(chat.id)),
        reader.delete(archive_url(chat.id)),
        reader.post(DELETE_MANY, {"ids": [chat.id]}, format="json"),
        reader.post(ARCHIVE_MANY, {"ids": [chat.id]}, format="json"),
    ]
    assert [r.status_code for r in refused] == [403] * 4
    session = APIClient(enforce_csrf_checks=True)
    session.force_login(alice)
    assert session.post(DELETE_MANY, {"ids": [chat.id]}, format="json").status_code == 403
    assert session.post(archive_url(chat.id)).status_code == 403
    assert APIClient().post(DELETE_MANY, {"ids": [chat.id]}, format="json").status_code == 401
    assert Conversation.objects.filter(id=chat.id, archived_at__isnull=True).exists()
    # With the page's token, as the chat page sends it.
    page = Client()
    page.force_login(alice)
    page.get(reverse("conversations:chat"))
    token = page.cookies["csrftoken"].value
    session.cookies["csrftoken"] = token
    response = session.post(DELETE_MANY, {"ids": [chat.id]}, format="json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200 and not Conversation.objects.exists()
