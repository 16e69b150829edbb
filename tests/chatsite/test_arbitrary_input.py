"""Arbitrary JSON at every endpoint and at the chat socket: never a 5xx, never a crash, every refusal in
the API's error shape, and a refused request writes nothing.

The bodies are arbitrary JSON values, and objects with each endpoint's own fields holding arbitrary
values. None may start a generation (no engine runs here): a send names a model that does not exist
or goes into a conversation whose answer is still being written, and a completion names a model that
does not exist, so each is refused however well formed the rest is. Requests that may be valid
(creating, renaming, listing, reading, moderating) may succeed, and are then not held to writing
nothing.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from channels.db import database_sync_to_async
from django.conf import settings as django_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.models import ApiKey
from accounts.services import api_key_create
from billing.models import UsageRecord
from conversations.models import Conversation, Message, Project, SavedPrompt
from conversations.services import conversation_create, project_create
from inference.defaults import DEFAULT_DEPLOYMENT_NAME
from inference.models import Generation
from inference.services import generation_finish
from tests.helpers.databases import rate_limits_clear
from tests.helpers.sockets import next_event, open_socket

pytestmark = pytest.mark.django_db(transaction=True)

HTTP_EXAMPLES = 100
SOCKET_EXAMPLES = 60
FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats()  # NaN and infinities too: json.dumps writes them, and they are not JSON
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)
# Nesting deep enough to exhaust Python's recursion in json.loads, and any depth short of it.
deep_json = st.tuples(st.integers(min_value=1, max_value=3000), st.booleans()).map(
    lambda p: "[" * p[0] + "]" * p[0] if p[1] else '{"a":' * p[0] + "1" + "}" * p[0]
)
uuids = st.uuids().map(str)
unknown_models = json_values.filter(lambda value: value is not None and value != DEFAULT_DEPLOYMENT_NAME)


def fields(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with these fields, each valid or arbitrary, plus now and then a field nobody reads."""
    extra = st.dictionaries(st.text(max_size=8), json_values, max_size=2)
    return st.tuples(st.fixed_dictionaries(required, optional=optional), extra).map(lambda pair: {**pair[1], **pair[0]})


def valid_or(*valid: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(valid) | json_values


chat_messages = st.lists(
    fields(
        {"role": valid_or("user", "system", "assistant", "developer")},
        {
            "content": valid_or(
                "Hello",
                "",
                [{"type": "text", "text": "Hi"}],
                # Images: a data URL that is no image, an address (off by default, and a private one).
                [
                    {"type": "text", "text": "Hi"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
                [{"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}],
            )
        },
    ),
    max_size=3,
)
COMPLETION = fields(
    {"model": unknown_models},
    {
        "messages": chat_messages | json_values,
        **{
            name: valid_or(*values)
            for name, values in {
                "stream": (True, False),
                "stream_options": ({"include_usage": True},),
                "n": (1, 8, 9),
                "temperature": (0, 0.7, 2),
                "top_p": (0.5, 1),
                "max_tokens": (1, 10**6),
                "max_completion_tokens": (16,),
                "stop": ("\n", ["a", "b"]),
                "seed": (0, 2**63 - 1, 2**63),
                "presence_penalty": (0, -2),
                "frequency_penalty": (0, 2),
                "user": ("alice",),
                "response_format": (
                    {"type": "json_object"},
                    {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
                ),
                "logit_bias": ({"1": 5}, {"²": 1}),
                "top_k": (1, -1),
                "min_p": (0.1,),
                "min_tokens": (1,),
                "ignore_eos": (True,),
                "stop_token_ids": ([2],),
                "tools": ([],),
                "logprobs": (False, True),
            }.items()
        },
    },
)
MODERATION = fields({}, {"input": valid_or("Hello", ["Hello", "there"], []), "model": valid_or("omni-moderation")})
CREATE = fields({}, {"title": valid_or("Plans", ""), "model": valid_or(DEFAULT_DEPLOYMENT_NAME, None)})
RENAME = fields({}, {"title": valid_or("Renamed", "")})
PROMPT = fields({}, {"command": valid_or("summarize", "/Two-Words", "two words", ""), "text": valid_or("Hi", "")})
SEND_CONTENT = {"content": valid_or("Hello", "", "  "), "client_id": valid_or(None) | uuids}
SEND_NEW = fields({"model": unknown_models}, SEND_CONTENT)
SEND_INTO_BUSY = fields({}, {**SEND_CONTENT, "model": valid_or(DEFAULT_DEPLOYMENT_NAME)})
PROJECT = fields(
    {},
    {
        "name": valid_or("Trip", "", " ", "x" * 101),
        "instructions": valid_or("Be brief.", "", "\x00"),
        "default_model": valid_or("", "auto", DEFAULT_DEPLOYMENT_NAME, "no-such-model"),
    },
)


def encoded(bodies: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """The body as JSON (with NaN or Infinity where a float is one), arbitrary JSON, JSON nested
    deep, a body just over the upload limit, or not JSON at all."""
    return st.one_of(
        bodies.map(lambda body: json.dumps(body).encode()),
        json_values.map(lambda body: json.dumps(body).encode()),
        deep_json.map(str.encode),
        st.just(b'{"content": "' + b"x" * django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE + b'"}'),
        st.binary(max_size=40),
    )


def cursors() -> st.SearchStrategy[str]:
    """Arbitrary text, and cursors made the way the paginator makes them, of arbitrary parts."""
    number = st.sampled_from(["0", "1", "2"]) | st.text(max_size=5)
    position = st.text(max_size=30) | st.sampled_from(["2026-11-28 10:00:00+00:00", "2026-11-28", ""])
    made = st.tuples(number, number, position).map(
        lambda p: base64.b64encode(f"o={p[0]}&r={p[1]}&p={p[2]}".encode()).decode()
    )
    return made | st.text(max_size=40)


class Setting:
    """Alice's busy conversation (an answer still being written), Bob's, and ids of every kind."""

    def __init__(self, alice, bob) -> None:
        self.busy = conversation_create(user=alice, title="Busy")
        question = Message.objects.create(conversation=self.busy, role=Message.Role.USER, content="Hi?")
        self.answer = Message.objects.create(
            conversation=self.busy, role=Message.Role.ASSISTANT, status=Message.Status.STREAMING, parent=question
        )
        self.bobs = conversation_create(user=bob, title="Bob's")
        self.key = api_key_create(user=alice, name="fuzz", scopes=list(ApiKey.Scope.values)).key
        self.project = project_create(owner=alice, name="Alice's project")
        self.bobs_project = project_create(owner=bob, name="Bob's project")
        self.prompt = SavedPrompt.objects.create(owner=alice, command="mine", text="Alice's")
        self.bobs_prompt = SavedPrompt.objects.create(owner=bob, command="mine", text="Bob's")

    def requests(self) -> st.SearchStrategy[tuple[str, str, bytes, str]]:
        """(method, path, body, content type) for every operation of both APIs."""
        any_id = st.sampled_from([self.busy.id, self.bobs.id, 0, 2**63, 10**30]) | st.integers(min_value=0)
        not_alices = st.sampled_from([self.bobs.id, 0, 2**63, 10**30])
        json_type = st.sampled_from(["application/json", "application/json; charset=utf-8"])
        content_type = json_type | st.sampled_from(["text/plain", "application/x-www-form-urlencoded", ""])

        def query(path: str, params: st.SearchStrategy) -> st.SearchStrategy:
            return params.map(lambda p: f"{path}?{urlencode(p)}" if p else path)

        prompt_ids = st.sampled_from([self.prompt.id, self.bobs_prompt.id, 0, 2**63, 10**30]) | st.integers(min_value=0)
        not_alices_prompts = st.sampled_from([self.bobs_prompt.id, 0, 2**63, 10**30])
        list_query = st.fixed_dictionaries(
            {"cursor": cursors()},
            optional={
                "limit": st.text(max_size=6),
                "archived": st.sampled_from(["true", "false"]) | st.text(max_size=6),
            },
        )
        some_ids = st.lists(valid_or(self.busy.id, self.bobs.id, 0, 2**63, "1"), max_size=4)
        # A batch to delete always names one conversation that is not alice's: it must be refused whole.
        ids_with_one_not_alices = st.tuples(some_ids, not_alices).map(lambda pair: [*pair[0], pair[1]])
        delete_many = fields({"ids": ids_with_one_not_alices}, {})
        archive_many = fields({}, {"ids": some_ids | json_values})
        project_id = st.sampled_from([self.project.id, self.bobs_project.id, 0, 2**63, 10**30]) | st.integers(0)
        not_alices_project = st.sampled_from([self.bobs_project.id, 0, 2**63, 10**30])
        move = fields({}, {"project": valid_or(None, self.project.id, self.bobs_project.id, 0, 2**63)})
        chats_choice = st.fixed_dictionaries({}, optional={"chats": valid_or("delete", "keep") | st.text(max_size=8)})
        return st.one_of(
            st.tuples(st.just("GET"), st.just("/api/projects/"), st.just(b""), json_type),
            st.tuples(st.just("POST"), st.just("/api/projects/"), encoded(PROJECT), content_type),
            st.tuples(st.just("GET"), project_id.map(project_path), st.just(b""), json_type),
            st.tuples(st.just("PATCH"), project_id.map(project_path), encoded(PROJECT), content_type),
            # Alice's own project only without a valid choice: deleting it would leave nothing to fuzz.
            st.tuples(
                st.just("DELETE"),
                st.one_of(
                    st.tuples(not_alices_project, chats_choice),
                    st.tuples(
                        st.just(self.project.id),
                        st.fixed_dictionaries(
                            {}, optional={"chats": st.text(max_size=8).filter(lambda c: c not in ("delete", "keep"))}
                        ),
                    ),
                ).map(lambda p: f"{project_path(p[0])}?{urlencode(p[1])}" if p[1] else project_path(p[0])),
                st.just(b""),
                json_type,
            ),
            st.tuples(st.just("GET"), project_id.map(lambda i: f"{project_path(i)}files/"), st.just(b""), json_type),
            st.tuples(
                st.just("POST"), project_id.map(lambda i: f"{project_path(i)}files/"), encoded(PROJECT), content_type
            ),
            st.tuples(
                st.just("PUT"), any_id.map(lambda i: f"{conversation_path(i)}project/"), encoded(move), content_type
            ),
            st.tuples(st.just("POST"), st.just("/v1/chat/completions"), encoded(COMPLETION), content_type),
            st.tuples(st.just("POST"), st.just("/v1/moderations"), encoded(MODERATION), content_type),
            st.tuples(st.just("GET"), st.just("/v1/models"), st.just(b""), json_type),
            st.tuples(st.just("GET"), query("/api/conversations/", list_query), st.just(b""), json_type),
            st.tuples(st.just("POST"), st.just("/api/conversations/"), encoded(CREATE), content_type),
            st.tuples(st.just("GET"), any_id.map(conversation_path), st.just(b""), json_type),
            st.tuples(st.just("PATCH"), any_id.map(conversation_path), encoded(RENAME), content_type),
            st.tuples(st.just("DELETE"), not_alices.map(conversation_path), encoded(RENAME), content_type),
            st.tuples(
                st.sampled_from(["POST", "DELETE"]),
                any_id.map(lambda i: f"{conversation_path(i)}archive/"),
                encoded(RENAME),
                content_type,
            ),
            st.tuples(st.just("POST"), st.just("/api/conversations/bulk-delete/"), encoded(delete_many), content_type),
            st.tuples(
                st.just("POST"), st.just("/api/conversations/bulk-archive/"), encoded(archive_many), content_type
            ),
            st.tuples(st.just("POST"), st.just("/api/conversations/messages/"), encoded(SEND_NEW), content_type),
            st.tuples(
                st.just("POST"),
                st.sampled_from([self.busy.id, self.bobs.id, 10**30]).map(lambda i: f"{conversation_path(i)}messages/"),
                encoded(SEND_INTO_BUSY),
                content_type,
            ),
            st.tuples(st.just("GET"), st.just("/api/prompts/"), st.just(b""), json_type),
            st.tuples(st.just("POST"), st.just("/api/prompts/"), encoded(PROMPT), content_type),
            st.tuples(st.just("PATCH"), prompt_ids.map(lambda i: f"/api/prompts/{i}/"), encoded(PROMPT), content_type),
            st.tuples(
                st.just("DELETE"), not_alices_prompts.map(lambda i: f"/api/prompts/{i}/"), st.just(b""), json_type
            ),
            st.tuples(st.sampled_from(["PUT", "GET"]), st.just("/v1/chat/completions"), st.just(b"{}"), json_type),
        )


def conversation_path(conversation_id: int) -> str:
    return f"/api/conversations/{conversation_id}/"


def project_path(project_id: int) -> str:
    return f"/api/projects/{project_id}/"


MAY_SUCCEED = {
    ("GET", "/v1/models"),
    ("POST", "/v1/moderations"),
    ("GET", "/api/conversations/"),
    ("POST", "/api/conversations/"),
    ("GET", "/api/conversations/{id}/"),
    ("PATCH", "/api/conversations/{id}/"),
    ("DELETE", "/api/conversations/{id}/"),
    ("GET", "/api/projects/"),
    ("POST", "/api/projects/"),
    ("GET", "/api/projects/{id}/"),
    ("PATCH", "/api/projects/{id}/"),
    ("GET", "/api/projects/{id}/files/"),
    ("PUT", "/api/conversations/{id}/project/"),
    ("GET", "/api/prompts/"),
    ("POST", "/api/prompts/"),
    ("PATCH", "/api/prompts/{id}/"),
    ("POST", "/api/conversations/{id}/archive/"),
    ("DELETE", "/api/conversations/{id}/archive/"),
    ("POST", "/api/conversations/bulk-archive/"),
}


def operation(method: str, path: str) -> tuple[str, str]:
    parts = path.split("?")[0].split("/")
    return method, "/".join("{id}" if part.isdigit() else part for part in parts)


def rows() -> tuple[int, ...]:
    return (
        Conversation.objects.count(),
        Conversation.objects.filter(archived_at__isnull=False).count(),
        list(Conversation.objects.order_by("id").values_list("project_id", flat=True)),
        Project.objects.count(),
        Message.objects.count(),
        Generation.objects.count(),
        UsageRecord.objects.count(),
        *SavedPrompt.objects.order_by("id").values_list("id", "command", "text"),
    )


def assert_api_error(response: httpx.Response) -> None:
    assert response.headers["Content-Type"] == "application/json", response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] in ("invalid_request_error", "permission_error", "rate_limit_error")


@pytest.fixture
def setting(alice, bob) -> Setting:
    return Setting(alice, bob)


@pytest.fixture
async def api(setting):
    """The real ASGI application, in this process, with alice's API key."""
    from chatsite.asgi import application

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application),
        base_url="http://localhost",
        headers={"Authorization": f"Bearer {setting.key}"},
    ) as client:
        yield client


@settings(FUZZ, max_examples=HTTP_EXAMPLES)
@given(data=st.data())
async def test_no_body_at_any_endpoint_is_a_server_error_or_writes_when_refused(setting, api, data):
    method, path, body, content_type = data.draw(setting.requests(), label="request")
    rate_limits_clear()  # the property is about bodies, not about how many arrive in a minute
    before = await database_sync_to_async(rows)()
    headers = {"Content-Type": content_type} if content_type else {}
    response = await api.request(method, path, content=body, headers=headers)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert_api_error(response)
        assert await database_sync_to_async(rows)() == before
    else:
        assert operation(method, path) in MAY_SUCCEED, response.text
    assert await Message.objects.filter(conversation_id=setting.busy.id).acount() == 2
    assert not await Generation.objects.aexists()
    assert await SavedPrompt.objects.filter(id=setting.bobs_prompt.id, text="Bob's").aexists()


def socket_frames(setting: Setting, ended_elsewhere: str) -> st.SearchStrategy[str]:
    """Frames of every type the socket takes, with fields valid or arbitrary, and arbitrary frames."""
    ids = valid_or(setting.answer.id, setting.busy.id, 0, 2**63, 10**30)
    generations = valid_or(ended_elsewhere, str(uuid.uuid4())) | uuids
    kinds = valid_or("message.send", "generation.stop", "generation.resume", "message.regenerate", "tool.approve")
    send = {
        "content": valid_or("Hello", ""),
        "client_id": valid_or(None) | uuids,
        "retry": valid_or(True, False),
        "tools": valid_or(True, False),
        "tool": valid_or("search_files", "no_such_tool"),
    }
    projects = valid_or(setting.project.id, setting.bobs_project.id, 0, 2**63, "1")
    frames = st.one_of(
        fields({"type": st.just("message.send"), "model": unknown_models}, {**send, "conversation": ids}),
        # A new chat in a project (alice's, bob's, none): refused for its model, or for bob's project.
        fields({"type": st.just("message.send"), "model": unknown_models}, {**send, "project": projects}),
        # A project with a conversation: refused whatever else (an existing one moves instead).
        fields(
            {
                "type": st.just("message.send"),
                "project": st.sampled_from([setting.project.id, setting.bobs_project.id]),
                "conversation": st.sampled_from([setting.busy.id, 0, 2**63]),
            },
            {**send, "model": valid_or(DEFAULT_DEPLOYMENT_NAME)},
        ),
        fields(
            {"type": st.just("message.send"), "conversation": st.just(setting.busy.id)},
            {**send, "model": valid_or(DEFAULT_DEPLOYMENT_NAME)},
        ),
        fields({"type": st.just("message.regenerate")}, {"message": ids, "replaces": valid_or(None) | uuids}),
        fields({"type": st.just("generation.stop")}, {"generation": generations}),
        fields({"type": st.just("generation.resume")}, {"generation": generations, "after_seq": valid_or(0, 1)}),
        # An answer to a tool call nobody asked about (docs/tools.md).
        fields(
            {"type": st.just("tool.approve")},
            {"generation": generations, "call": valid_or("call-1"), "decision": valid_or("once", "chat", "deny")},
        ),
        fields({"type": kinds}, {}),
    )
    return st.one_of(
        frames.map(json.dumps),
        fields({"type": json_values}, {}).map(json.dumps),
        deep_json,
        json_values.map(json.dumps),
        st.text(min_size=1, max_size=40),
    )


async def finished_generation(user, deployment) -> str:
    generation = await Generation.objects.acreate(user=user, deployment=deployment, prompt_token_ids=[1], sampling={})
    await database_sync_to_async(generation_finish)(
        generation_id=generation.id, status="complete", text="Done.", finish_reason="stop"
    )
    return str(generation.id)


@pytest.fixture
async def probes(alice, default_deployment) -> tuple[str, str]:
    """Two of alice's answers, ended: one to ask for after each frame, one for frames to name."""
    return (
        await finished_generation(alice, default_deployment),
        await finished_generation(alice, default_deployment),
    )


@settings(FUZZ, max_examples=SOCKET_EXAMPLES)
@given(data=st.data())
async def test_no_frame_crashes_the_socket_or_writes(alice, setting, probes, engine_not_started, data):
    probe, ended_elsewhere = probes
    frame = data.draw(socket_frames(setting, ended_elsewhere), label="frame")
    rate_limits_clear()
    before = await database_sync_to_async(rows)()
    socket, connected = await open_socket(alice)
    assert connected
    await socket.send_to(text_data=frame)
    # Resuming an answer that has ended is always answered (`generation.done`): whatever the frame
    # brought back arrives before that answer, and the socket must still be there to give it.
    await socket.send_json_to({"type": "generation.resume", "generation": probe})
    while (event := await next_event(socket, timeout=10)).get("generation") != probe:
        assert event["type"] in ("error", "generation.done"), event
        assert event.get("code") != "internal_error", event
    assert event["type"] == "generation.done"
    assert await database_sync_to_async(rows)() == before
    await socket.disconnect()
