from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from unittest.mock import ANY, patch

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from accounts.models import Tier
from chatsite.database import database_calls_concurrent, db_async
from conversations.consumers import ChatConsumer
from conversations.models import Message
from conversations.requests import AnswerRequest, SendRequest
from conversations.services import conversation_create, message_send
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.models import Generation, ModelDeployment
from inference.openai.wire import usage
from inference.services import generation_finish
from inference.streaming.streams import StreamPublisher, replay_buffer
from tests.helpers.engines import SCRIPTED_DEFAULT
from tests.helpers.sockets import (
    DropsLiveSends,
    drain_until_finished,
    events_but_broadcasts,
    layer_channels,
    next_event,
    open_socket,
    stopped_while_streaming,
)

pytestmark = pytest.mark.django_db(transaction=True)


async def test_an_unauthenticated_socket_is_refused():
    _, connected = await open_socket(None)
    assert not connected


async def test_a_socket_from_a_foreign_origin_is_refused(alice):
    _, connected = await open_socket(alice, origin="http://evil.example")
    assert not connected


async def test_a_socket_without_an_origin_is_refused(alice):
    _, connected = await open_socket(alice, origin="")
    assert not connected


async def _a_socket_reads_its_channel_until_it_closes(user) -> None:
    before = layer_channels()
    socket, _ = await open_socket(user)
    opened = layer_channels() - before
    assert len(opened) == 1, opened
    channel = opened.pop()
    await get_channel_layer().send(channel, {"type": "engine.status", "deployment": "elsewhere", "state": "ready"})
    assert await socket.receive_json_from(timeout=10) == {
        "type": "engine.status",
        "deployment": "elsewhere",
        "state": "ready",
    }
    await socket.disconnect()
    # Its reader is gone with it: nothing more is queued for, or subscribed to, on its channel.
    assert channel not in layer_channels()


async def test_a_socket_closed_by_its_client_reads_no_more_from_it(alice):
    """uvicorn answers every receive after a close with another disconnect, at once, without
    waiting: the consumer takes the first, stops reading its client, and ends."""
    from django.test import Client

    from chatsite.asgi import application

    client = Client()
    await database_sync_to_async(client.force_login)(alice)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost"), (b"cookie", cookie)]
    scope = {"type": "websocket", "path": "/ws/chat/", "query_string": b"", "headers": headers, "subprotocols": []}
    closed, greeted = asyncio.Event(), asyncio.Event()
    connected, reads_after_close = False, 0

    async def receive() -> dict:
        nonlocal connected, reads_after_close
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        await closed.wait()  # once set, this returns without giving the loop a turn, as uvicorn's does
        reads_after_close += 1
        if reads_after_close > 100:  # a consumer reading on would spin here for ever
            raise AssertionError("the consumer read on after its client closed")
        return {"type": "websocket.disconnect", "code": 1005}

    async def send(message: dict) -> None:
        if message["type"] == "websocket.send":  # its greeting, once accepted
            greeted.set()

    consumer = asyncio.ensure_future(application(scope, receive, send))
    await asyncio.wait_for(greeted.wait(), timeout=30)
    closed.set()
    await asyncio.wait_for(consumer, timeout=10)
    assert reads_after_close == 1


# A consumer that read on after the close would spin, holding the loop (and this test) until the
# timeout's signal broke into it: the test then fails on the time its socket took to end.
@pytest.mark.timeout(120)
async def test_a_socket_its_client_closes_ends_on_uvicorn(alice, served_app, server_without_engine):
    import websockets
    from django.test import Client

    client = Client()
    await database_sync_to_async(client.force_login)(alice)
    async with websockets.connect(
        server_without_engine.replace("http://", "ws://") + "/ws/chat/",
        origin=server_without_engine,
        additional_headers={"Cookie": f"sessionid={client.cookies['sessionid'].value}"},
        open_timeout=30,
    ) as socket:
        assert json.loads(await socket.recv())["type"] == "engine.status"
        closed_at = time.monotonic()
    # The consumer ends with its socket: uvicorn's task for the connection is gone soon after.
    state = served_app.server.server_state
    while state.tasks and time.monotonic() - closed_at < 10:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.05)
    assert not state.tasks and time.monotonic() - closed_at < 10


async def test_a_client_that_leaves_while_its_message_is_saved_ends_it_quietly(
    alice, served_app, server_without_engine, engine_not_started, caplog
):
    # The client sends and is gone at once: the send is saved, and the socket's end logs no failure
    # (uvicorn refuses the send's reply; the consumer ends as for any other disconnect).
    import websockets
    from django.test import Client

    client = Client()
    await database_sync_to_async(client.force_login)(alice)
    socket = await websockets.connect(
        server_without_engine.replace("http://", "ws://") + "/ws/chat/",
        origin=server_without_engine,
        additional_headers={"Cookie": f"sessionid={client.cookies['sessionid'].value}"},
        open_timeout=30,
    )
    assert json.loads(await socket.recv())["type"] == "engine.status"
    client_id = str(uuid.uuid4())
    await socket.send(json.dumps({"type": "message.send", "content": "Hello, and goodbye", "client_id": client_id}))
    socket.transport.abort()
    left_at = time.monotonic()
    state = served_app.server.server_state
    while state.tasks and time.monotonic() - left_at < 10:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.05)
    assert not state.tasks
    assert await Message.objects.filter(client_id=client_id, conversation__user=alice).aexists()
    assert [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


async def test_a_socket_reads_its_channel_until_it_closes(alice):
    await _a_socket_reads_its_channel_until_it_closes(alice)


@pytest.mark.topology
async def test_a_socket_reads_its_channel_on_redis_until_it_closes(alice):
    await _a_socket_reads_its_channel_until_it_closes(alice)


@pytest.mark.topology
async def test_it_refuses_to_send_into_another_users_conversation(alice, mallory):
    sent = await database_sync_to_async(message_send)(
        user=alice, request=SendRequest(content="Alice's private question")
    )
    socket, connected = await open_socket(mallory)
    assert connected
    await socket.send_json_to({"type": "message.send", "conversation": sent.conversation.id, "content": "hi"})
    reply = await next_event(socket, timeout=10)
    assert reply == {"type": "error", "code": "not_found", "message": "That conversation does not exist."}
    assert await sent.conversation.messages.acount() == 2
    await socket.disconnect()


@pytest.mark.topology
async def test_it_refuses_to_stop_or_follow_another_users_answer(alice, mallory):
    sent = await database_sync_to_async(message_send)(user=alice, request=SendRequest(content="Alice's question"))
    socket, _ = await open_socket(mallory)
    for request in ({"type": "generation.stop"}, {"type": "generation.resume", "after_seq": 0}):
        await socket.send_json_to({**request, "generation": str(sent.generation.id)})
        assert (await next_event(socket, timeout=10))["code"] == "not_found"
    generation = await Generation.objects.aget(id=sent.generation.id)
    assert not generation.stop_requested
    await socket.disconnect()


@pytest.mark.parametrize(
    "frame",
    [
        '{"type": "message.send", "content": ',
        "[1, 2]",
        '{"type": "nonsense"}',
        '{"type": "generation.stop", "generation": "not-a-uuid"}',
        '{"type": "message.send", "content": "hi", "conversation": "1; DROP TABLE"}',
    ],
)
async def test_malformed_frames_get_an_error_and_change_nothing(alice, frame):
    socket, _ = await open_socket(alice)
    await socket.send_to(text_data=frame)
    reply = await next_event(socket, timeout=10)
    assert reply["type"] == "error"
    assert not await Message.objects.aexists()
    await socket.send_to(text_data='{"type": "nonsense"}')  # the socket is still usable
    assert (await next_event(socket, timeout=10))["type"] == "error"
    await socket.disconnect()


@pytest.fixture
async def finished_generation(unclaimed_generation):
    """Alice's answer, ended: resuming it is a request the socket answers (`generation.done`)
    without any engine."""
    await database_sync_to_async(generation_finish)(
        generation_id=unclaimed_generation.id, status="complete", text="Done.", finish_reason="stop"
    )
    return unclaimed_generation


DEEP_FRAME = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "frame",
    [
        {"type": ["message.send"]},
        {"type": {"a": 1}},
        DEEP_FRAME,
        '{"type": "message.send", "content": "hi", "nested": ' + "[" * 900 + "]" * 900 + "}",
        '{"type": "generation.resume", "generation": "x", "after_seq": NaN}',
        {"type": "message.send", "content": "hi", "conversation": True},
        {"type": "message.send", "content": "hi", "conversation": 10**40},
        {"type": "message.send", "content": "hi", "conversation": 1.0},
        {"type": "message.send", "content": "hi", "conversation": [1]},
        {"type": "message.send", "content": "hi", "model": ["default"]},
        {"type": "message.send", "content": "hi", "model": "bad\x00name"},
        {"type": "message.send", "content": "hi", "model": "m" * 10_000},
        {"type": "message.send", "content": ["hi"]},
        {"type": "message.send", "content": {"text": "hi"}},
        {"type": "message.send", "content": "hi", "client_id": {"id": 1}},
        {"type": "message.send", "content": "hi", "client_id": 10**40},
        {"type": "message.send", "content": "hi", "retry": 1},
        {"type": "message.send", "content": "hi", "retry": [True]},
        {"type": "message.regenerate", "message": True},
        {"type": "message.regenerate", "message": 10**40},
        {"type": "message.regenerate", "message": -(10**40)},
        {"type": "message.regenerate", "message": [1]},
        {"type": "message.regenerate", "message": 1, "replaces": {"id": "x"}},
        {"type": "generation.stop", "generation": ["x"]},
        {"type": "generation.stop", "generation": 10**40},
        {"type": "generation.resume", "generation": {"id": "x"}},
        {"type": "generation.resume", "after_seq": True},
        {"type": "generation.resume", "after_seq": 10**40},
        {"type": "generation.resume", "after_seq": [0]},
    ],
)
@pytest.mark.topology
async def test_a_frame_of_wrong_types_gets_an_error_and_the_socket_goes_on(
    alice, finished_generation, engine_not_started, frame
):
    socket, _ = await open_socket(alice)
    await socket.send_to(text_data=frame if isinstance(frame, str) else json.dumps(frame))
    reply = await next_event(socket, timeout=10)
    assert reply["type"] == "error" and reply["code"] not in ("internal_error", None)
    assert not await Message.objects.aexists() and await Generation.objects.acount() == 1
    # The same socket still serves a request: the finished answer is resumed from its row.
    await socket.send_json_to({"type": "generation.resume", "generation": str(finished_generation.id)})
    assert (await next_event(socket, timeout=10))["type"] == "generation.done"
    await socket.disconnect()


async def test_a_request_that_fails_unforeseen_gets_an_error_and_the_socket_goes_on(
    alice, finished_generation, engine_not_started, monkeypatch
):
    from conversations import consumers

    def broken(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(consumers, "message_regenerate", broken)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.regenerate", "message": 1})
    assert await next_event(socket, timeout=10) == {
        "type": "error",
        "code": "internal_error",
        "message": "The request failed.",
    }
    await socket.send_json_to({"type": "generation.resume", "generation": str(finished_generation.id)})
    assert (await next_event(socket, timeout=10))["type"] == "generation.done"
    await socket.disconnect()


@pytest.mark.django_db(transaction=True, reset_sequences=True)
async def test_a_conversation_named_by_a_bool_is_refused_not_taken_for_id_1(alice, engine_not_started):
    conversation = await database_sync_to_async(conversation_create)(user=alice, title="Plans")
    assert conversation.id == 1  # so that True, which Python counts as 1, would name it
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "Hi", "conversation": True, "model": "nope"})
    reply = await next_event(socket, timeout=10)
    assert (reply["type"], reply["code"]) == ("error", "invalid_request")
    assert not await Message.objects.aexists()
    await socket.disconnect()


@pytest.mark.engine
@pytest.mark.topology
async def test_a_message_streams_deltas_in_order_and_ends_with_done(engine, alice):
    socket, _ = await open_socket(alice)
    await socket.send_json_to(
        {"type": "message.send", "conversation": None, "content": "What is the capital of France?"}
    )
    events = await drain_until_finished(socket)
    types = [e["type"] for e in events]
    assert types[:2] == ["conversation.created", "message.accepted"]
    deltas = [e for e in events if e["type"] == "generation.delta"]
    done = events[-1]
    assert done["type"] == "generation.done", done
    assert deltas, "the answer should arrive as deltas"
    seqs = [e["seq"] for e in deltas] + [done["seq"]]
    assert seqs == list(range(1, len(seqs) + 1))
    assert done["status"] == "complete"
    assert done["usage"]["completion_tokens"] > 0
    text = "".join(e["text"] for e in deltas)
    assert text.strip()
    answer = await Message.objects.aget(id=events[1]["assistant_message"]["id"])
    assert answer.status == Message.Status.COMPLETE
    assert answer.content == text
    assert answer.token_count == done["usage"]["completion_tokens"]
    await socket.disconnect()


async def _stop_after_three_deltas(socket) -> tuple[tuple[dict, list[dict], list[dict], str], bool]:
    """Ask for a long answer, stop it after its third delta, read on to its end. Returns the
    acceptance, the deltas before the stop, the events after it and a timeline, and whether the
    answer was still running when the stop was sent."""
    await socket.send_json_to(
        {
            "type": "message.send",
            "content": "Write a very long story about a dragon who learns to bake bread. [write on]",
        }
    )
    sent_at = time.monotonic()
    accepted = None
    deltas = []
    while len(deltas) < 3:
        event = await next_event(socket)
        if event["type"] == "message.accepted":
            accepted = event
        elif event["type"] == "generation.delta":
            deltas.append(event)
    running = not (await Generation.objects.aget(id=accepted["generation"])).is_finished
    stopped_at = time.monotonic()
    await socket.send_json_to({"type": "generation.stop", "generation": accepted["generation"]})
    events = await drain_until_finished(socket)
    timeline = (
        f"third delta {stopped_at - sent_at:.2f} s after the send, done {time.monotonic() - stopped_at:.2f} s"
        f" after the stop, {len(events)} events between: {events[-1]}"
    )
    return (accepted, deltas, events, timeline), running


@pytest.mark.topology
async def test_stop_ends_the_generation_in_the_engine_and_keeps_the_partial_text(engine, alice):
    socket, _ = await open_socket(alice)
    accepted, deltas, events, timeline = await stopped_while_streaming(lambda: _stop_after_three_deltas(socket))
    done = events[-1]
    assert done["type"] == "generation.done", timeline
    assert done["status"] == "stopped", f"the answer ended on its own first: {timeline}"
    streamed = "".join(e["text"] for e in deltas + events if e["type"] == "generation.delta")
    answer = await Message.objects.aget(id=accepted["assistant_message"]["id"])
    assert answer.status == Message.Status.STOPPED
    assert answer.content == streamed and streamed
    # The stop ended it, not its token budget. How many tokens the engine writes between the stop
    # and the abort depends on the machine's load, so no count is asserted: only that it was cut.
    generation = await Generation.objects.aget(id=accepted["generation"])
    assert generation.finish_reason == "abort"
    assert done["usage"]["completion_tokens"] < generation.sampling["max_tokens"], timeline
    # The engine itself no longer works on it.
    for _ in range(100):
        if not await engine.engine_requests():
            break
        await asyncio.sleep(0.05)
    assert await engine.engine_requests() == 0
    await socket.disconnect()


@pytest.mark.topology
async def test_a_reconnecting_client_resumes_from_the_last_seq_it_saw(engine, alice):
    first, _ = await open_socket(alice)
    await first.send_json_to({"type": "message.send", "content": "Name three colours of the rainbow."})
    accepted, seen = None, []
    while len(seen) < 2:
        event = await next_event(first)
        if event["type"] == "message.accepted":
            accepted = event
        elif event["type"] == "generation.delta":
            seen.append(event)
    await first.disconnect()  # e.g. a reload or a dropped connection

    second, _ = await open_socket(alice)
    await second.send_json_to(
        {"type": "generation.resume", "generation": accepted["generation"], "after_seq": seen[-1]["seq"]}
    )
    rest = await drain_until_finished(second)
    resumed = [e for e in rest if e["type"] == "generation.delta"]
    assert [e["seq"] for e in resumed + [rest[-1]]] == list(range(seen[-1]["seq"] + 1, rest[-1]["seq"] + 1))
    answer = await Message.objects.aget(id=accepted["assistant_message"]["id"])
    assert answer.content == "".join(e["text"] for e in seen + resumed)
    await second.disconnect()


@pytest.mark.topology
async def test_a_stream_that_ends_while_a_follower_joins_reaches_it_whole(
    engine, alice, default_deployment, monkeypatch
):
    """The follower finds the buffer empty (the answer has not begun), the answer then runs its whole
    course, and the follower finds the row finished: it still gets every event, once and in order.

    The engine is up first only so that its start-up, which ends answers left running by an earlier
    server, does not end this one; the answer itself is published here, at the moment that matters."""
    generation = await Generation.objects.acreate(
        user=alice, deployment=default_deployment, prompt_token_ids=[1], sampling={}, status=Generation.Status.RUNNING
    )
    buffer = replay_buffer()
    read = buffer.read
    looked = []

    async def read_then_stream(generation_id, after_seq):
        events = await read(generation_id, after_seq)
        if not looked:  # the whole answer happens right after the follower's first look
            looked.append(events)
            publisher = StreamPublisher(generation.id)
            await publisher.add_text("Hello")
            await publisher.add_text(" there.")
            await database_sync_to_async(generation_finish)(
                generation_id=generation.id, status=Generation.Status.COMPLETE, text=publisher.text, completion_tokens=2
            )
            await publisher.finish(status="complete", finish_reason="stop", usage=usage(1, 2))
        return events

    monkeypatch.setattr(buffer, "read", read_then_stream)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "generation.resume", "generation": str(generation.id), "after_seq": 0})
    events = await drain_until_finished(socket)
    assert looked == [[]]
    assert [e["type"] for e in events] == ["generation.delta", "generation.delta", "generation.done"]
    assert [e["seq"] for e in events] == [1, 2, 3]
    assert "".join(e["text"] for e in events[:2]) == "Hello there."
    assert await events_but_broadcasts(socket, timeout=0.3) == []
    await socket.disconnect()


@pytest.mark.topology
async def test_a_stream_is_forwarded_while_the_shared_sync_thread_is_busy(alice, default_deployment):
    """Deltas reach the socket without a hop to the process's one shared sync thread: channels checks
    database connections there before every event a consumer handles, so any sync work queued on
    that thread (another socket's, Django's) held up every stream of the process."""
    socket, publisher = await _following_a_stream(alice, default_deployment)
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait, thread_sensitive=True)())
    try:
        await publisher.add_text(" there.")
        await publisher.flush()
        event = await next_event(socket, timeout=3)
    finally:
        release.set()
        await busy
    assert (event["type"], event["seq"], event["text"]) == ("generation.delta", 2, " there.")
    await socket.disconnect()


@pytest.mark.topology
async def test_a_socket_takes_what_live_delivery_skipped_from_the_buffer(alice, default_deployment):
    """Live delivery may drop an event (a full channel, a lost connection): one that never arrives
    live is taken from the replay buffer when the next one shows the gap, so the socket still passes
    on every event once, in order."""
    socket, publisher = await _following_a_stream(alice, default_deployment)
    layer, publisher._layer = publisher._layer, DropsLiveSends()
    await publisher.add_text(" there")
    await publisher.flush()
    publisher._layer = layer
    await publisher.add_text(" again.")
    await publisher.finish(status="complete", finish_reason="stop", usage=usage(1, 3))
    events = await drain_until_finished(socket, timeout=5)
    assert [(e["seq"], e["type"]) for e in events] == [
        (2, "generation.delta"),
        (3, "generation.delta"),
        (4, "generation.done"),
    ]
    assert "".join(e["text"] for e in events[:2]) == " there again."
    assert await events_but_broadcasts(socket, timeout=0.3) == []
    await socket.disconnect()


@pytest.mark.topology
async def test_a_socket_finds_an_ending_live_delivery_dropped(alice, default_deployment, settings):
    """Nothing comes after a stream's last event to show the gap: a stream that has gone quiet is
    looked up in the buffer, or the answer would never finish on screen."""
    settings.INFERENCE_STREAM_RESYNC_S = 0.2
    socket, publisher = await _following_a_stream(alice, default_deployment)
    publisher._layer = DropsLiveSends()
    await publisher.finish(status="complete", finish_reason="stop", usage=usage(1, 1))
    events = await drain_until_finished(socket, timeout=5)
    assert [(e["seq"], e["type"], e["status"]) for e in events] == [(2, "generation.done", "complete")]
    await socket.disconnect()


@pytest.fixture
async def served_elsewhere():
    """A deployment no engine of this process serves: its generations stay queued here, even from a
    start-up's recovery (a socket's connect starts the local backend)."""
    return await ModelDeployment.objects.acreate(name="smollm2-elsewhere", **DEFAULT_DEPLOYMENT_FIELDS)


@pytest.mark.topology
async def test_a_queued_answer_ended_in_the_database_ends_on_the_socket(alice, served_elsewhere, settings):
    """An answer ended where this process hears nothing of it (another server on the same database,
    a reaper whose Redis lost the stream) has only its row to say so: a socket waiting on it reads
    the row once the stream has been quiet a while, instead of showing "…" for ever."""
    settings.INFERENCE_STREAM_RESYNC_S = 0.2
    generation = await Generation.objects.acreate(
        user=alice, deployment=served_elsewhere, prompt_token_ids=[1], sampling={}
    )
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "generation.resume", "generation": str(generation.id), "after_seq": 0})
    await asyncio.sleep(0.3)  # following it, queued: nothing to say yet

    await Generation.objects.filter(id=generation.id).aupdate(
        status=Generation.Status.FAILED, error_code="worker_lost", error_message="The server stopped."
    )

    event = await next_event(socket, timeout=3)
    assert (event["type"], event["seq"], event["code"], event["message"]) == (
        "generation.error",
        1,
        "worker_lost",
        "The server stopped.",
    )
    assert await events_but_broadcasts(socket, timeout=0.5) == []
    await socket.disconnect()


@pytest.mark.topology
async def test_a_streaming_answer_ended_in_the_database_ends_on_the_socket_with_its_whole_text(
    alice, served_elsewhere, settings
):
    settings.INFERENCE_STREAM_RESYNC_S = 0.2
    socket, _ = await _following_a_stream(alice, served_elsewhere)  # it has shown "Hello" (seq 1)
    generation = await Generation.objects.aget(user=alice)

    await Generation.objects.filter(id=generation.id).aupdate(
        status=Generation.Status.COMPLETE,
        text="Hello there.",
        finish_reason="stop",
        prompt_tokens=1,
        completion_tokens=3,
    )

    event = await next_event(socket, timeout=3)
    assert (event["type"], event["seq"], event["status"], event["text"]) == (
        "generation.done",
        2,
        "complete",
        "Hello there.",
    )
    assert event["usage"] == usage(1, 3)
    await socket.disconnect()


@pytest.mark.topology
async def test_asking_again_for_an_answer_that_ended_without_its_end_in_the_buffer_ends_it_at_once(
    alice, served_elsewhere, settings
):
    """The page asks again (`generation.resume`) for an answer that has been quiet a few seconds.
    The buffer holds its text but not its end: the reply is the end from its row, at once, not at
    the socket's next quiet-stream round."""
    settings.INFERENCE_STREAM_RESYNC_S = 600  # that round never comes in this test
    socket, _ = await _following_a_stream(alice, served_elsewhere)  # it has shown "Hello" (seq 1)
    generation = await Generation.objects.aget(user=alice)
    await Generation.objects.filter(id=generation.id).aupdate(
        status=Generation.Status.COMPLETE, text="Hello there.", finish_reason="stop", completion_tokens=3
    )
    assert await events_but_broadcasts(socket, timeout=0.3) == []

    await socket.send_json_to({"type": "generation.resume", "generation": str(generation.id), "after_seq": 1})

    event = await next_event(socket, timeout=3)
    assert (event["type"], event["seq"], event["status"], event["text"]) == (
        "generation.done",
        2,
        "complete",
        "Hello there.",
    )
    assert await events_but_broadcasts(socket, timeout=0.3) == []
    await socket.disconnect()


@pytest.mark.topology
async def test_a_socket_whose_buffer_cannot_be_read_still_ends_an_answer_from_its_row(
    alice, served_elsewhere, settings, monkeypatch
):
    """Redis down: the buffer cannot be read, and the row still tells the socket the answer ended."""
    settings.INFERENCE_STREAM_RESYNC_S = 0.2
    socket, _ = await _following_a_stream(alice, served_elsewhere)
    generation = await Generation.objects.aget(user=alice)

    async def unreachable(generation_id, after_seq):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(replay_buffer(), "read", unreachable)
    await Generation.objects.filter(id=generation.id).aupdate(
        status=Generation.Status.FAILED, error_code="worker_lost", error_message="The server stopped.", text="Hello"
    )

    event = await next_event(socket, timeout=3)
    assert (event["type"], event["seq"], event["code"]) == ("generation.error", 2, "worker_lost")
    await socket.disconnect()


@pytest.mark.topology
async def test_a_message_sent_again_after_its_socket_dropped_is_answered_once(engine, alice):
    """The page's socket drops after sending, before it hears the answer (a web process restarted,
    a network change): on its next socket it sends the same frame as a retry, and gets the message
    its first send saved and that message's whole answer, with nothing saved or generated twice."""
    frame = {
        "type": "message.send",
        "conversation": None,
        "content": "Name two planets.",
        "client_id": "5e0c7c1a-3b2d-4c8e-9f61-2a4b6d8e0f13",
    }
    first, _ = await open_socket(alice)
    await first.send_json_to(frame)
    heard = await next_event(first)
    while heard["type"] != "message.accepted":
        heard = await next_event(first)
    await first.disconnect()  # whatever the first socket heard is lost with it

    second, _ = await open_socket(alice)
    await second.send_json_to({**frame, "retry": True})
    events = await drain_until_finished(second)
    created, accepted = events[0], events[1]
    assert created == {"type": "conversation.created", "conversation": {"id": heard["conversation"], "title": ANY}}
    assert accepted["type"] == "message.accepted" and accepted["client_id"] == frame["client_id"]
    for field in ("conversation", "user_message", "assistant_message", "generation"):
        assert accepted[field] == heard[field]
    stream = events[2:]
    assert stream[-1]["type"] == "generation.done", stream[-1]
    assert [e["seq"] for e in stream] == list(range(1, len(stream) + 1))  # the answer from its start
    answer = await Message.objects.aget(id=accepted["assistant_message"]["id"])
    assert answer.content == "".join(e["text"] for e in stream if e["type"] == "generation.delta")
    assert await Message.objects.acount() == 2
    assert await Generation.objects.acount() == 1
    await second.disconnect()


async def test_a_refused_send_names_its_client_id(alice):
    socket, _ = await open_socket(alice)
    client_id = "5e0c7c1a-3b2d-4c8e-9f61-2a4b6d8e0f14"
    await socket.send_json_to({"type": "message.send", "content": "   ", "client_id": client_id})
    reply = await next_event(socket, timeout=10)
    assert (reply["type"], reply["code"], reply["client_id"]) == ("error", "invalid_message", client_id)
    for bad in ({"client_id": "nope"}, {"client_id": client_id, "retry": "yes"}):
        await socket.send_json_to({"type": "message.send", "content": "Hello", **bad})
        assert (await next_event(socket, timeout=10))["code"] == "invalid_request"
    assert not await Message.objects.aexists()
    await socket.disconnect()


@pytest.mark.topology
async def test_a_message_sent_while_the_model_loads_waits_for_it(engine, alice):
    # The engine is already up here; what matters is that the runner waits on readiness, not that it
    # races it: a send straight after connecting is answered, not refused.
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "Say hello."})
    events = await drain_until_finished(socket)
    assert events[-1]["type"] == "generation.done"
    await socket.disconnect()


@pytest.mark.topology
async def test_a_second_tab_on_the_same_conversation_sees_the_same_stream(engine, alice, short_answers):
    first, _ = await open_socket(alice)
    second, _ = await open_socket(alice)
    await first.send_json_to({"type": "message.send", "content": "List three fruits."})
    accepted = None
    while accepted is None:
        event = await next_event(first)
        accepted = event if event["type"] == "message.accepted" else None
    # The second tab learns of the answer from the page (data-generation) and follows it from 0.
    await second.send_json_to({"type": "generation.resume", "generation": accepted["generation"], "after_seq": 0})
    in_first = [e for e in await drain_until_finished(first) if e["type"] == "generation.delta"]
    second_events = await drain_until_finished(second)
    in_second = [e for e in second_events if e["type"] == "generation.delta"]
    assert second_events[-1]["type"] == "generation.done"
    assert "".join(e["text"] for e in in_second) == "".join(e["text"] for e in in_first)
    assert [e["seq"] for e in in_second] == [e["seq"] for e in in_first]
    await first.disconnect()
    await second.disconnect()


@pytest.mark.topology
async def test_a_failed_answer_is_regenerated_over_the_socket(engine, alice):
    from inference.services import generation_finish

    sent = await database_sync_to_async(message_send)(user=alice, request=SendRequest(content="Say hello to Alice."))
    await database_sync_to_async(generation_finish)(
        generation_id=sent.generation.id, status="failed", text="", error_code="worker_lost"
    )
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.regenerate", "message": sent.assistant_message.id})
    events = await drain_until_finished(socket)
    assert events[0]["type"] == "message.regenerating"
    assert events[-1]["type"] == "generation.done"
    # A new answer beside the failed one, which stays as it ended.
    answer = await Message.objects.aget(id=events[0]["assistant_message"]["id"])
    assert answer.status == Message.Status.COMPLETE and answer.content
    assert answer.parent_id == sent.user_message.id
    assert events[0]["assistant_message"]["siblings"] == [sent.assistant_message.id, answer.id]
    assert (await Message.objects.aget(id=sent.assistant_message.id)).status == Message.Status.FAILED
    await socket.disconnect()


async def test_an_answer_is_regenerated_over_the_socket_by_the_model_it_names(engine, alice):
    # Embedded only: the production topology's test worker serves the default deployment alone.
    second = await ModelDeployment.objects.acreate(name="smollm2-second", **DEFAULT_DEPLOYMENT_FIELDS)
    await (await Tier.objects.aget(name="free")).deployments.aadd(second)
    outside = await ModelDeployment.objects.acreate(name="smollm2-pro-only", **DEFAULT_DEPLOYMENT_FIELDS)
    sent = await database_sync_to_async(message_send)(user=alice, request=SendRequest(content="Say hello to Alice."))
    await database_sync_to_async(generation_finish)(generation_id=sent.generation.id, status="complete", text="Hi.")
    socket, _ = await open_socket(alice)
    frame = {"type": "message.regenerate", "message": sent.assistant_message.id}
    await socket.send_json_to({**frame, "model": outside.name})
    refused = await next_event(socket)
    assert (refused["type"], refused["code"]) == ("error", "model_not_allowed")
    assert await Generation.objects.acount() == 1

    await socket.send_json_to({**frame, "model": second.name})
    events = await drain_until_finished(socket)
    assert events[0]["type"] == "message.regenerating"
    assert events[0]["model"] == second.answer_model  # the label the page shows under the answer
    assert events[-1]["type"] == "generation.done" and events[-1]["status"] == "complete"
    generation = await Generation.objects.aget(id=events[0]["generation"])
    assert generation.deployment_id == second.id
    await socket.disconnect()


@pytest.mark.topology
async def test_a_regenerate_sent_again_is_answered_with_the_answer_it_began(alice, monkeypatch):
    """The socket dropped after the server began the new answer, before the page heard so: the page
    sends the same request again on its next socket, and follows that answer; none is queued."""
    from conversations.services import message_regenerate

    # The test ends both answers itself: none is sent to an engine, where the run's worker (started
    # once by an earlier engine test, in the production topology) would stream one of them too.
    monkeypatch.setattr("inference.services.generation_dispatch", lambda **dispatch: None)
    sent = await database_sync_to_async(message_send)(user=alice, request=SendRequest(content="Say hello to Alice."))
    await database_sync_to_async(generation_finish)(
        generation_id=sent.generation.id, status="failed", text="", error_code="worker_lost"
    )
    request = {"type": "message.regenerate", "message": sent.assistant_message.id, "replaces": str(sent.generation.id)}
    # The first try, whose answer the dropped socket never delivered; the answer has ended since.
    first = await database_sync_to_async(message_regenerate)(user=alice, request=AnswerRequest.parse(request))
    await database_sync_to_async(generation_finish)(generation_id=first.generation.id, status="complete", text="Hello!")

    socket, _ = await open_socket(alice)
    await socket.send_json_to(request)
    events = await drain_until_finished(socket)
    assert events[0] == {
        "type": "message.regenerating",
        "regenerated": sent.assistant_message.id,
        "assistant_message": {
            "id": first.answer.id,
            "parent": sent.user_message.id,
            "siblings": [sent.assistant_message.id, first.answer.id],
        },
        "generation": str(first.generation.id),
        "model": SCRIPTED_DEFAULT,
        "replayed": True,
    }
    assert (events[-1]["type"], events[-1]["generation"], events[-1]["text"]) == (
        "generation.done",
        str(first.generation.id),
        "Hello!",
    )
    assert await Generation.objects.acount() == 2
    await socket.send_json_to({**request, "replaces": "nonsense"})
    refused = await next_event(socket)
    assert (refused["type"], refused["code"]) == ("error", "invalid_request")
    assert await Generation.objects.acount() == 2
    await socket.disconnect()


@pytest.mark.topology
async def test_a_regenerate_replayed_as_an_answer_continued_since_says_what_it_had_before(alice, monkeypatch):
    """Another tab regenerated the answer and continued the new one: a stale regenerate is answered
    with it, and with its text before the continuation, which its stream does not hold."""
    from conversations.services import message_continue, message_regenerate

    monkeypatch.setattr("inference.services.generation_dispatch", lambda **dispatch: None)
    sent = await database_sync_to_async(message_send)(user=alice, request=SendRequest(content="Tell a story."))
    await database_sync_to_async(generation_finish)(generation_id=sent.generation.id, status="complete", text="No.")
    request = {"type": "message.regenerate", "message": sent.assistant_message.id, "replaces": str(sent.generation.id)}
    other = await database_sync_to_async(message_regenerate)(user=alice, request=AnswerRequest.parse(request))
    await database_sync_to_async(generation_finish)(
        generation_id=other.generation.id, status="complete", text="Once upon", finish_reason="length"
    )
    continued = await database_sync_to_async(message_continue)(
        user=alice,
        request=AnswerRequest.parse({"message": other.answer.id, "replaces": str(other.generation.id)}),
    )
    await database_sync_to_async(generation_finish)(
        generation_id=continued.generation.id, status="complete", text=" a time."
    )

    socket, _ = await open_socket(alice)
    await socket.send_json_to(request)
    events = await drain_until_finished(socket)
    assert events[0]["replayed"] and events[0]["generation"] == str(continued.generation.id)
    assert events[0]["assistant_message"]["text_before"] == "Once upon"
    assert events[-1]["text"] == " a time."
    assert await Generation.objects.acount() == 3
    await socket.disconnect()


@pytest.mark.topology
async def test_a_stream_just_queued_is_followed_without_waiting_for_the_database(alice, default_deployment):
    """Eight messages sent at once: while the others' transactions hold every database thread, a
    socket whose message was just queued joins its stream at once, so its first text is not held
    up (its handler must return before the socket can forward anything)."""
    generation = await Generation.objects.acreate(
        user=alice, deployment=default_deployment, prompt_token_ids=[1], sampling={}
    )
    consumer = ChatConsumer()
    consumer.channel_layer = get_channel_layer()
    consumer.channel_name = await consumer.channel_layer.new_channel()
    consumer.user = alice
    consumer.streams = consumer._stream_follower()
    release = threading.Event()
    threads = settings.DATABASE_ASYNC_THREADS if database_calls_concurrent() else 1
    busy = [asyncio.ensure_future(db_async(release.wait)()) for _ in range(threads)]
    try:
        await asyncio.wait_for(consumer._follow(generation, after_seq=0, fresh=True), timeout=3)
    finally:
        release.set()
        await asyncio.gather(*busy)
    await StreamPublisher(generation.id).add_text("Hello")
    event = await asyncio.wait_for(consumer.channel_layer.receive(consumer.channel_name), timeout=5)
    assert (event["type"], event["seq"], event["text"]) == ("generation.delta", 1, "Hello")


async def _following_a_stream(user, deployment):
    """A socket of `user` following a new stream, and the stream's publisher, once the socket has
    passed on its first text (seq 1, "Hello")."""
    generation = await Generation.objects.acreate(user=user, deployment=deployment, prompt_token_ids=[1], sampling={})
    socket, _ = await open_socket(user)
    await socket.send_json_to({"type": "generation.resume", "generation": str(generation.id), "after_seq": 0})
    # The socket handles one frame at a time: the answer to this one says the resume has run to its
    # end (joined, read the empty buffer and the queued row), so "Hello" comes live and nothing of
    # that resume is left to race what the test does next.
    await socket.send_json_to({"type": "no.such.type"})
    refused = await next_event(socket, timeout=5)
    assert refused["type"] == "error", refused
    publisher = StreamPublisher(generation.id, coalesce_ms=0)
    await publisher.add_text("Hello")
    first = await next_event(socket, timeout=5)
    assert (first["seq"], first["text"]) == (1, "Hello")  # it follows the stream
    return socket, publisher


# --- faults on the server ---------------------------------------------------------------------------


@pytest.mark.topology
async def test_a_send_whose_database_connection_drops_after_its_commit_is_still_accepted(
    alice, one_database_thread, monkeypatch
):
    """The message is committed; the connection the next call (its verdict's) meets was dropped by
    PostgreSQL. The socket used to die with no reply, the message saved and its answer held."""
    import uuid

    from moderation.services import InputCheck
    from tests.helpers.databases import database_connection_dropped

    scored = InputCheck.scored

    async def scored_then_connection_dropped(self):
        await scored(self)
        await database_connection_dropped()

    monkeypatch.setattr(InputCheck, "scored", scored_then_connection_dropped)
    socket, _ = await open_socket(alice)
    client_id = str(uuid.uuid4())

    await socket.send_json_to({"type": "message.send", "content": "Hello there", "client_id": client_id})

    created = await next_event(socket)
    assert created["type"] == "conversation.created", created
    accepted = await next_event(socket)
    assert (accepted["type"], accepted["client_id"]) == ("message.accepted", client_id), accepted
    assert await Message.objects.filter(client_id=client_id).acount() == 1
    generation = await Generation.objects.aget(id=accepted["generation"])
    assert not generation.awaiting_verdict  # released: its answer is shown


@pytest.mark.topology
async def test_a_send_whose_database_connection_was_dropped_before_it_is_saved_once_and_accepted(
    alice, one_database_thread
):
    import uuid

    from tests.helpers.databases import database_connection_dropped

    socket, _ = await open_socket(alice)
    client_id = str(uuid.uuid4())
    await database_connection_dropped()

    await socket.send_json_to({"type": "message.send", "content": "Hello there", "client_id": client_id})

    assert (await next_event(socket))["type"] == "conversation.created"
    accepted = await next_event(socket)
    assert (accepted["type"], accepted["client_id"]) == ("message.accepted", client_id), accepted
    assert await Message.objects.filter(client_id=client_id).acount() == 1


def _resyncing() -> set[asyncio.Task]:
    return {
        task
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "").endswith("_resync_quiet_streams")
    }


async def test_a_send_that_fails_on_the_server_is_answered_and_the_socket_closed(alice, monkeypatch):
    """It may have been saved before it failed: the page then reconnects and repeats it as a retry
    (answered with what the first saved), instead of waiting on a socket that will never answer it."""

    async def fails(self, content):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ChatConsumer, "_message_send", fails)
    socket, _ = await open_socket(alice)

    await socket.send_json_to({"type": "message.send", "content": "Hi", "client_id": str(uuid.uuid4())})

    error = await next_event(socket)
    assert (error["type"], error["code"]) == ("error", "server_error")
    assert "client_id" not in error
    assert (await socket.receive_output(timeout=5)) == {"type": "websocket.close", "code": 1011}


@pytest.mark.topology
async def test_a_socket_that_ends_on_an_exception_ends_its_background_tasks(alice, monkeypatch):
    """An exception out of a consumer ends it without a disconnect: its resync used to run on,
    failing every few seconds for the life of the process."""
    from inference.streaming.streams import engine_status_broadcast

    async def fails(self, event):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ChatConsumer, "engine_status", fails)
    before = _resyncing()
    socket, _ = await open_socket(alice)
    ours = _resyncing() - before
    assert len(ours) == 1

    await engine_status_broadcast("smollm2-135m", "ready")  # every socket hears these

    with pytest.raises(RuntimeError):
        await asyncio.wait_for(asyncio.shield(socket.future), timeout=10)
    await asyncio.sleep(0)
    assert all(task.done() for task in ours), "the consumer's resync should end with it"


async def test_a_message_too_long_for_the_window_is_refused_before_any_work(alice):
    # A plan that caps the window at 2,048 tokens, which one message's characters can overflow.
    await Tier.objects.filter(name="free").aupdate(max_context=2048)
    socket, _ = await open_socket(alice)
    with (
        patch("moderation.services.score_many", side_effect=AssertionError("scored")) as scoring,
        patch("conversations.services.sending.count_tokens", side_effect=AssertionError("tokenized")) as tokenizing,
        patch(
            "conversations.services.conversations.count_tokens", side_effect=AssertionError("tokenized")
        ) as measuring,
    ):
        await socket.send_json_to({"type": "message.send", "content": "word " * 6_000})
        reply = await next_event(socket, timeout=10)
    assert reply["type"] == "error" and reply["code"] == "context_length_exceeded"
    assert not scoring.called and not tokenizing.called and not measuring.called
    assert not await Message.objects.aexists() and not await Generation.objects.aexists()
    await socket.disconnect()
