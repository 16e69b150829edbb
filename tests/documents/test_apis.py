"""The files API and the conversations API's files: uploads, progress, deletion, search, citations,
and one user never reaching another's files or passages through any of them."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import ApiKey
from accounts.services import api_key_create
from conversations.models import Citation
from conversations.requests import SendRequest
from conversations.services import conversation_start, message_send
from documents.models import Chunk, Document
from tests.documents.test_answering import FACT, POISONED
from tests.helpers.factories import PASSWORD

pytestmark = pytest.mark.django_db


def client_for(user, scopes=tuple(ApiKey.Scope.values)) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(user=user, name='t', scopes=list(scopes)).key}")
    return client


def a_file(name: str = "harbour.md", text: str = f"# Harbour\n\n{FACT}") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, text.encode(), content_type="text/markdown")


def test_a_file_uploaded_into_the_library_is_listed_and_processed(alice, django_capture_on_commit_callbacks):
    from documents.services import document_process

    client = client_for(alice)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        response = client.post("/api/files/", {"file": a_file()}, format="multipart")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["name"], body["kind"], body["status"], body["library"]) == ("harbour.md", "markdown", "queued", True)
    assert len(queued) == 1  # processing is dispatched once the upload has committed
    document_process(document_id=body["id"])
    detail = client.get(f"/api/files/{body['id']}/").json()
    assert (detail["status"], detail["progress"], detail["chunk_count"]) == ("ready", 100, 1)
    assert [f["id"] for f in client.get("/api/files/").json()] == [body["id"]]


def test_bad_uploads_get_clear_errors_and_store_nothing(alice):
    client = client_for(alice)
    cases = [
        ({"file": a_file("x.exe", "MZ")}, 400, "unsupported_file_type"),
        ({"file": a_file("empty.txt", "")}, 400, "empty_file"),
        ({}, 400, "invalid_request"),
    ]
    for data, status, code in cases:
        response = client.post("/api/files/", data, format="multipart")
        assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    assert client.post("/api/files/", {"file": "x"}, format="json").status_code == 415
    assert not Document.objects.exists()


def test_a_file_too_big_for_the_plan_is_a_413(alice, settings):
    from accounts.models import Tier
    from documents.models import TierDocumentLimits

    # The plan's own row (a transactional test's flush removes the one the migration made).
    TierDocumentLimits.objects.update_or_create(tier=Tier.objects.get(name="free"), defaults={"max_file_bytes": 10})
    response = client_for(alice).post("/api/files/", {"file": a_file()}, format="multipart")
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"
    assert not Document.objects.exists()


def test_a_file_attached_to_a_conversation_serves_it_and_the_answer_returns_citations(alice, upload_ready):
    client = client_for(alice)
    conversation = conversation_start(user=alice)
    response = client.post(f"/api/conversations/{conversation.id}/files/", {"file": a_file()}, format="multipart")
    assert response.status_code == 201 and response.json()["conversation"] == conversation.id
    from documents.services import document_process

    document_process(document_id=response.json()["id"])
    assert [f["name"] for f in client.get(f"/api/conversations/{conversation.id}/files/").json()] == ["harbour.md"]
    sent = message_send(
        user=alice,
        request=SendRequest(content="Who was the harbour master of Port Aldwin?", conversation_id=conversation.id),
    )
    messages = client.get(f"/api/conversations/{conversation.id}/").json()["messages"]
    answer = next(m for m in messages if m["id"] == sent.assistant_message.id)
    assert answer["citations"] == [
        {
            "number": 1,
            "file": "harbour.md",
            "document": response.json()["id"],
            "page": None,
            "heading": "Harbour",
            "passage": FACT,
            "withheld": False,
            "cited": False,  # the answer's text has no [1]
        }
    ]
    one = client.get(f"/api/conversations/{conversation.id}/messages/{sent.assistant_message.id}/citations/")
    assert one.json()["citations"] == answer["citations"]


def test_a_poisoned_files_withheld_passage_is_reported_by_the_api(alice, upload_ready):
    upload_ready(alice, "harbour.md", POISONED)
    sent = message_send(
        user=alice, request=SendRequest(content="What does the note to the assistant in harbour.md say?")
    )
    citations = client_for(alice).get(f"/api/conversations/{sent.conversation.id}/").json()["messages"][-1]["citations"]
    assert {"file": "harbour.md", "withheld": True, "passage": ""}.items() <= citations[-1].items()


def test_search_finds_your_passages_only(alice, bob, upload_ready):
    upload_ready(alice, "harbour.md", f"# Harbour\n\n{FACT}")
    upload_ready(bob, "bob.md", "# Bob\n\nBob's harbour master was Angus Drummond.")
    found = client_for(alice).get("/api/files/search/", {"q": "harbour master"}).json()["results"]
    assert [r["file"] for r in found] == ["harbour.md"] and found[0]["passage"] == FACT
    assert client_for(alice).get("/api/files/search/", {"q": ""}).status_code == 400


def test_deleting_a_file_removes_its_passages(alice, upload_ready):
    document = upload_ready(alice, "harbour.md", f"# Harbour\n\n{FACT}")
    assert client_for(alice).delete(f"/api/files/{document.id}/").status_code == 204
    assert not Document.objects.exists() and not Chunk.objects.exists()


def test_another_users_files_are_not_found_through_every_endpoint(alice, mallory, upload_ready):
    document = upload_ready(alice, "harbour.md", f"# Harbour\n\n{FACT}")
    conversation = conversation_start(user=alice)
    sent = message_send(
        user=alice, request=SendRequest(content="Who was the harbour master?", conversation_id=conversation.id)
    )
    assert Citation.objects.filter(message=sent.assistant_message).exists()
    client = client_for(mallory)
    assert client.get(f"/api/files/{document.id}/").status_code == 404
    assert client.delete(f"/api/files/{document.id}/").status_code == 404
    assert client.get("/api/files/").json() == []
    assert client.get("/api/files/search/", {"q": "harbour master Quennell"}).json() == {"results": []}
    assert client.get(f"/api/conversations/{conversation.id}/files/").status_code == 404
    assert (
        client.post(f"/api/conversations/{conversation.id}/files/", {"file": a_file()}, format="multipart").status_code
        == 404
    )
    citations = f"/api/conversations/{conversation.id}/messages/{sent.assistant_message.id}/citations/"
    assert client.get(citations).status_code == 404
    # Mallory's own conversation, asked about alice's message: nothing either.
    own = conversation_start(user=mallory)
    assert client.get(f"/api/conversations/{own.id}/messages/{sent.assistant_message.id}/citations/").status_code == 404
    # The pages: the library lists only the caller's files, and deleting another's is a 404.
    page = Client()
    page.login(username="mallory", password=PASSWORD)
    assert "harbour.md" not in page.get("/files/").content.decode()
    assert page.post(f"/files/{document.id}/delete/").status_code == 404
    assert Document.objects.filter(id=document.id).exists()


def test_each_endpoint_needs_its_scope(alice, upload_ready):
    document = upload_ready(alice, "harbour.md", f"# Harbour\n\n{FACT}")
    reader = client_for(alice, scopes=[ApiKey.Scope.CONVERSATIONS_READ])
    assert reader.get(f"/api/files/{document.id}/").status_code == 200
    assert reader.delete(f"/api/files/{document.id}/").status_code == 403
    assert reader.post("/api/files/", {"file": a_file()}, format="multipart").status_code == 403
    chat_only = client_for(alice, scopes=[ApiKey.Scope.CHAT])
    assert chat_only.get("/api/files/").status_code == 403
    assert APIClient().get("/api/files/").status_code in (401, 403)


def test_the_library_page_uploads_lists_and_deletes(alice, django_capture_on_commit_callbacks):
    page = Client()
    page.login(username="alice", password=PASSWORD)
    response = page.post("/files/", {"file": a_file()})
    assert response.status_code == 302
    document = Document.objects.get(owner=alice)
    listed = page.get("/files/").content.decode()
    assert "harbour.md" in listed and "Processing" in listed
    refused = page.post("/files/", {"file": a_file("bad.exe", "MZ")})
    assert refused.status_code == 400 and "cannot be read here" in refused.content.decode()
    assert page.post(f"/files/{document.id}/delete/").status_code == 302
    assert not Document.objects.exists()


def test_the_usage_page_counts_storage(alice, upload_ready):
    upload_ready(alice, "harbour.md", f"# Harbour\n\n{FACT}")
    page = Client()
    page.login(username="alice", password=PASSWORD)
    html = page.get("/accounts/usage/").content.decode()
    assert "files" in html and "1 ·" in html and "bytes" in html


def test_a_free_users_uploads_are_limited_per_hour_and_deleting_gives_none_back(alice):
    client = client_for(alice)
    limit = alice.tier.file_uploads_per_hour
    for _ in range(limit):
        created = client.post("/api/files/", {"file": a_file()}, format="multipart")
        assert created.status_code == 201, created.json()
        assert client.delete(f"/api/files/{created.json()['id']}/").status_code == 204
    refused = client.post("/api/files/", {"file": a_file()}, format="multipart")
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) > 0
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limited", "rate_limit_error")
    assert f"{limit} file uploads an hour" in error["message"]
    assert not Document.objects.exists()


def test_the_days_processing_limit_refuses_an_upload_on_every_way_in(alice):
    alice.tier.documents_per_day = 1
    alice.tier.save()
    client = client_for(alice)
    assert client.post("/api/files/", {"file": a_file()}, format="multipart").status_code == 201
    conversation = conversation_start(user=alice, title="")
    refused = [
        client.post("/api/files/", {"file": a_file()}, format="multipart"),
        client.post(f"/api/conversations/{conversation.id}/files/", {"file": a_file()}, format="multipart"),
    ]
    page = Client()
    page.login(username="alice", password=PASSWORD)
    refused.append(page.post("/files/", {"file": a_file()}))
    for response in refused:
        assert response.status_code == 429
        assert "files processed a day" in response.json()["error"]["message"]
    assert Document.objects.count() == 1


def test_searches_are_limited_per_minute(alice):
    client = client_for(alice)
    limit = alice.tier.file_searches_per_minute
    statuses = [client.get("/api/files/search/", {"q": "harbour"}).status_code for _ in range(limit + 1)]
    assert statuses == [200] * limit + [429]


def test_an_upload_refused_for_the_day_has_not_used_one_of_the_hours(alice):
    alice.tier.documents_per_day = 1
    alice.tier.file_uploads_per_hour = 2
    alice.tier.save()
    client = client_for(alice)
    assert client.post("/api/files/", {"file": a_file()}, format="multipart").status_code == 201
    assert client.post("/api/files/", {"file": a_file()}, format="multipart").status_code == 429
    alice.tier.documents_per_day = None
    alice.tier.save()
    assert client.post("/api/files/", {"file": a_file()}, format="multipart").status_code == 201


def test_an_answer_shows_only_the_passages_its_text_cites_and_those_left_out(alice):
    conversation = conversation_start(user=alice)
    question = conversation.messages.create(role="user", content="Where and when?")
    answer = conversation.messages.create(
        role="assistant", content="In Aldwin [2], in 1903 [2, 3]; not `[1]` alone.", parent=question, status="complete"
    )
    for number in (1, 2, 3, 4):
        Citation.objects.create(
            owner=alice, message=answer, number=number, file_name="f.md", passage=f"Passage {number}"
        )
    Citation.objects.create(owner=alice, message=answer, file_name="poison.md", withheld=True)

    found = client_for(alice).get(f"/api/conversations/{conversation.id}/messages/{answer.id}/citations/").json()
    assert [(c["number"], c["cited"], c["withheld"]) for c in found["citations"]] == [
        (1, True, False),  # a mark in code is still a mark: the text is not parsed as markdown
        (2, True, False),
        (3, True, False),
        (4, False, False),
        (0, False, True),
    ]
    page = Client()
    page.force_login(alice)
    html = page.get(f"/c/{conversation.id}/").content.decode()
    assert "Passage 2" in html and "Passage 3" in html and "Passage 4" not in html
    assert "A passage of poison.md was left out" in html
