"""The OpenAPI schema builds cleanly, and the API holds up against requests generated from it."""

from __future__ import annotations

from io import StringIO

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from accounts.models import ApiKey
from accounts.services import api_key_create
from conversations.services import conversation_create, project_create
from tests.helpers.databases import rate_limits_clear

# Sending a message or a (chat or text) completion starts a real generation: far too slow to fuzz
# on a CPU. Embeddings and tokenizing run in the web process, so they are fuzzed.
FUZZED_PATHS = (
    r"^/(api/conversations/(\{conversation_id\}/(archive/|project/)?|bulk-delete/|bulk-archive/)?"
    r"|api/projects/(\{project_id\}/(files/)?)?"
    r"|api/prompts/(\{prompt_id\}/)?|v1/models(/\{model_id\})?|v1/embeddings|tokenize|detokenize)$"
)
# Per run (an operation in one generation mode, or aimed at alice's and bob's ids): about 90 runs, so
# 10 each is some 900 requests. Enough here: this test proves the responses keep to the schema and no
# generated request is a server error, and a field the API does not check shows in a run's first few
# examples; arbitrary bodies at the same endpoints are fuzzed on their own in test_arbitrary_input.py.
EXAMPLES_PER_OPERATION = 10


def test_the_schema_validates_without_warnings():
    out = StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    assert "/api/conversations/{conversation_id}/messages/" in out.getvalue()


def test_the_schema_documents_the_conversations_api():
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    assert set(paths["/api/conversations/"]) == {"get", "post"}
    assert set(paths["/api/conversations/{conversation_id}/"]) == {"get", "patch", "delete"}
    send = paths["/api/conversations/{conversation_id}/messages/"]["post"]
    assert "text/event-stream" in send["responses"]["200"]["content"]
    assert "post" in paths["/api/conversations/messages/"]
    assert set(paths["/api/conversations/{conversation_id}/branch/"]) == {"post"}
    assert set(paths["/api/conversations/{conversation_id}/archive/"]) == {"post", "delete"}
    assert set(paths["/api/conversations/bulk-delete/"]) == {"post"}
    assert set(paths["/api/conversations/bulk-archive/"]) == {"post"}
    assert set(paths["/api/conversations/{conversation_id}/messages/{message_id}/feedback/"]) == {"put", "delete"}
    assert set(paths["/api/prompts/"]) == {"get", "post"}
    assert set(paths["/api/prompts/{prompt_id}/"]) == {"patch", "delete"}
    for path in ("/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize"):
        assert set(paths[path]) == {"post"}
    assert set(paths["/v1/models/{model_id}"]) == {"get"}
    assert set(paths["/api/projects/"]) == {"get", "post"}
    assert set(paths["/api/projects/{project_id}/"]) == {"get", "patch", "delete"}
    assert set(paths["/api/projects/{project_id}/files/"]) == {"get", "post"}
    assert set(paths["/api/conversations/{conversation_id}/project/"]) == {"put"}
    (chats,) = [p for p in paths["/api/projects/{project_id}/"]["delete"]["parameters"] if p["in"] == "query"]
    assert chats["name"] == "chats" and chats["required"] and chats["schema"]["enum"] == ["delete", "keep"]
    send_fields = send["requestBody"]["content"]["application/json"]["schema"]
    assert (
        "parent"
        in SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"][
            send_fields["$ref"].rsplit("/", 1)[-1]
        ]["properties"]
    )


@pytest.fixture
def wsgi_app():
    """The real request cycle in this thread, without closing the test's transaction between requests
    (what Django's own test client does too)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def test_generated_requests_never_cause_a_server_error(alice, bob, wsgi_app):
    key = api_key_create(user=alice, name="fuzz", scopes=list(ApiKey.Scope.values)).key
    for i in range(3):
        conversation_create(user=alice, title=f"Alice {i}")
        conversation_create(user=bob, title=f"Bob {i}")
    alices = conversation_create(user=alice, title="Kept busy").id
    bobs = conversation_create(user=bob, title="Not alice's").id
    alices_project = project_create(owner=alice, name="Alice's").id
    bobs_project = project_create(owner=bob, name="Bob's").id
    conversation_create(user=alice, title="In a project", project_id=alices_project)
    schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
    schema.app = wsgi_app
    operations = [result.ok() for result in schema.include(path_regex=FUZZED_PATHS).get_all_operations()]
    assert len(operations) == 26
    headers = {"Authorization": f"Bearer {key}"}

    runs = [(operation, mode, None) for operation in operations for mode in GenerationMode]
    # Random ids are mostly missing: also aim at one of alice's conversations and projects, and at bob's.
    runs += [
        (operation, mode, {"conversation_id": conversation_id})
        for operation in operations
        if "{conversation_id}" in operation.path and operation.method.upper() != "DELETE"
        for mode, conversation_id in (
            (GenerationMode.POSITIVE, alices),
            (GenerationMode.NEGATIVE, alices),
            (GenerationMode.POSITIVE, bobs),
        )
    ]
    runs += [
        (operation, mode, {"project_id": project_id})
        for operation in operations
        if "{project_id}" in operation.path and operation.method.upper() != "DELETE"
        for mode, project_id in (
            (GenerationMode.POSITIVE, alices_project),
            (GenerationMode.NEGATIVE, alices_project),
            (GenerationMode.POSITIVE, bobs_project),
        )
    ]
    for operation, mode, path_parameters in runs:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(mode, path_parameters=path_parameters))
        def fuzz(case):
            rate_limits_clear()  # the property is about requests' shapes, not how many arrive in a minute
            response = case.call(headers=headers)
            case.validate_response(
                response,
                checks=[not_a_server_error, content_type_conformance, response_schema_conformance],
                headers=headers,
            )

        fuzz()
