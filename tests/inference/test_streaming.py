"""Following streams outside a socket (the API's server-sent events): once each, in order, whatever
live delivery loses. Runs on the in-memory layer, and on channels-redis when REDIS_URL is set."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.layers import get_channel_layer
from django.conf import settings as django_settings

from inference.openai.wire import usage
from inference.streaming import streams as streaming
from inference.streaming.following import follow_streams
from inference.streaming.streams import StreamPublisher, generation_group, replay_buffer
from tests.helpers.sockets import DropsLiveSends, layer_channels

pytestmark = pytest.mark.topology


async def test_a_follower_takes_what_live_delivery_dropped_from_the_buffer():
    publisher, events, first = await _followed_from_its_first_text(coalesce_ms=0)
    layer, publisher._layer = publisher._layer, DropsLiveSends()
    await publisher.add_text(" there")
    publisher._layer = layer
    await publisher.finish(status="complete", finish_reason="stop", usage=usage(1, 2))
    rest = await asyncio.wait_for(_collect(events), timeout=5)
    assert [(e["seq"], e["type"]) for e in [first, *rest]] == [
        (1, "generation.delta"),
        (2, "generation.delta"),
        (3, "generation.done"),
    ]


async def test_a_follower_finds_an_ending_live_delivery_dropped(settings):
    settings.INFERENCE_STREAM_RESYNC_S = 0.2
    publisher, events, _ = await _followed_from_its_first_text()
    publisher._layer = DropsLiveSends()
    await publisher.finish(status="complete", finish_reason="stop", usage=usage(1, 1))
    rest = await asyncio.wait_for(_collect(events), timeout=3)
    assert [(e["seq"], e["type"]) for e in rest] == [(2, "generation.done")]


@pytest.mark.django_db(transaction=True)
async def test_a_follower_whose_buffer_cannot_be_read_ends_a_stream_from_its_row(
    unclaimed_generation, settings, monkeypatch
):
    """Redis down (or restarted, its buffers gone): the end of an answer ended meanwhile reaches no
    buffer, and a follower that cannot read one still ends the stream as the row says."""
    from inference.models import Generation

    settings.INFERENCE_STREAM_RESYNC_S = 0.2
    generation_id = str(unclaimed_generation.id)
    publisher = StreamPublisher(generation_id)
    await publisher.add_text("Hello")
    events = follow_streams([generation_id], idle_timeout=10)
    first = await anext(events)

    async def unreachable(generation_id, after_seq):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(replay_buffer(), "read", unreachable)
    await Generation.objects.filter(id=generation_id).aupdate(
        status=Generation.Status.STOPPED, text="Hello there", finish_reason="abort", completion_tokens=2
    )
    rest = await asyncio.wait_for(_collect(events), timeout=3)
    assert [(e["seq"], e["type"]) for e in [first, *rest]] == [(1, "generation.delta"), (2, "generation.done")]
    assert (rest[0]["status"], rest[0]["text"], rest[0]["finish_reason"]) == ("stopped", "Hello there", "abort")


async def test_a_follower_keeps_receiving_live_after_a_quiet_spell(settings, monkeypatch):
    # Waiting out a quiet spell must not cancel the follower's receive: a cancelled receive may
    # lose the message it was taking (and channels-redis's pub/sub layer unsubscribes the channel).
    settings.INFERENCE_STREAM_RESYNC_S = 0.1
    publisher, events, _ = await _followed_from_its_first_text(coalesce_ms=0)

    async def nothing_buffered(*args, **kwargs) -> list:
        return []

    monkeypatch.setattr(streaming, "events_after", nothing_buffered)  # from here on, live delivery only
    following = asyncio.ensure_future(_collect(events))
    await asyncio.sleep(0.5)
    await publisher.add_text(" again")
    await publisher.finish(status="complete", finish_reason="stop", usage=usage(1, 2))
    rest = await asyncio.wait_for(following, timeout=3)
    assert [e["seq"] for e in rest] == [2, 3]


@pytest.mark.skipif(not django_settings.REDIS_URL, reason="the Redis replay buffer and channel layer (REDIS_URL)")
async def test_on_redis_an_event_is_buffered_and_published_in_one_round_trip():
    """The buffer publishes the event itself, in the pipeline that appends it, under the channel
    name the layer's own group_send would use: a member of the group receives it live, and finds it
    in the buffer by then. channels-redis's group naming is not public API; this catches a change."""
    generation_id = str(uuid.uuid4())
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(generation_group(generation_id), channel)
    try:
        # The layer does not wait for Redis to confirm a subscription: one message through it first.
        await layer.group_send(generation_group(generation_id), {"type": "subscribed"})
        assert (await asyncio.wait_for(layer.receive(channel), timeout=3))["type"] == "subscribed"
        event = {"type": "generation.delta", "text": "Hello", "generation": generation_id, "seq": 1}
        published = await replay_buffer().append_and_publish(
            generation_id, event, layer, generation_group(generation_id)
        )
        received = await asyncio.wait_for(layer.receive(channel), timeout=3)
        buffered = await replay_buffer().read(generation_id, 0)
    finally:
        await layer.group_discard(generation_group(generation_id), channel)
    assert published
    assert received == event
    assert buffered == [event]


async def test_a_follow_that_ends_gives_its_channel_back():
    """Its reader's channel is unsubscribed (on Redis) or gone (in memory) once the streams end: a
    process serving answer after answer holds no channel for each one it has served."""
    before = layer_channels()
    publisher, events, _ = await _followed_from_its_first_text(coalesce_ms=0)
    await publisher.add_text(" there")
    await publisher.finish(status="complete", finish_reason="stop", usage=usage(1, 2))
    rest = await asyncio.wait_for(_collect(events), timeout=5)
    assert [e["seq"] for e in rest] == [2, 3]
    assert layer_channels() == before


async def test_a_follower_gives_up_after_its_idle_timeout(settings):
    settings.INFERENCE_STREAM_RESYNC_S = 0.1
    events = follow_streams([str(uuid.uuid4())], idle_timeout=0.3)
    try:
        await asyncio.wait_for(anext(events), timeout=3)
    except TimeoutError as exc:
        assert "no event" in str(exc)
    else:
        raise AssertionError("a follower with nothing to follow should time out")


async def _followed_from_its_first_text(**publisher_options):
    """A new stream's publisher, a follower of it, and the first text it got (from the buffer, after
    the follower had joined the stream)."""
    generation_id = str(uuid.uuid4())
    publisher = StreamPublisher(generation_id, **publisher_options)
    await publisher.add_text("Hello")
    events = follow_streams([generation_id], idle_timeout=10)
    return publisher, events, await anext(events)


async def _collect(events) -> list[dict]:
    return [event async for event in events]


async def test_streams_on_one_loop_share_pipelines_and_each_keeps_its_order(redis_url, monkeypatch):
    """Eight streams each appending five events at once: every event is in its stream's buffer, in
    order, and they went in a handful of writes rather than forty (one round trip each)."""
    from redis.asyncio.connection import AbstractConnection

    writes = []
    send = AbstractConnection.send_packed_command

    async def counted(connection, command, check_health=True):
        if isinstance(command, bytes) and b"RPUSH" in command:  # not the connection's own handshake
            writes.append(command)
        await send(connection, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    buffer = streaming.RedisReplayBuffer(redis_url, ttl_s=60)
    streams = [str(uuid.uuid4()) for _ in range(8)]

    async def stream(generation_id: str) -> None:
        for seq in range(1, 6):
            await buffer.append(generation_id, {"type": "generation.delta", "text": f"{seq} ", "seq": seq})

    await asyncio.wait_for(asyncio.gather(*(stream(g) for g in streams)), timeout=10)
    sent = len(writes)
    for generation_id in streams:
        assert [e["seq"] for e in await buffer.read(generation_id, 0)] == [1, 2, 3, 4, 5]
    assert sent <= 10, f"{sent} writes for 40 events of 8 streams"


async def test_a_command_that_fails_fails_its_own_caller_and_no_other(redis_url):
    """A batch's replies are all read, an error's too: the caller whose command Redis refused gets
    that error, the others their events appended, and the next batch reads its own replies."""
    import redis.asyncio as redis
    from redis.exceptions import ResponseError

    client = redis.Redis.from_url(redis_url)
    buffer = streaming.RedisReplayBuffer(redis_url, ttl_s=60)
    wrong, right = str(uuid.uuid4()), str(uuid.uuid4())
    await client.set(f"chatsite:stream:{wrong}", "not a list")
    try:
        results = await asyncio.gather(
            buffer.append(wrong, {"type": "generation.delta", "seq": 1}),
            buffer.append(right, {"type": "generation.delta", "seq": 1}),
            return_exceptions=True,
        )
        assert isinstance(results[0], ResponseError) and results[1] is None, results
        await buffer.append(right, {"type": "generation.delta", "seq": 2})
        assert [e["seq"] for e in await buffer.read(right, 0)] == [1, 2]
    finally:
        await client.delete(f"chatsite:stream:{wrong}", f"chatsite:stream:{right}")
        await client.aclose()


async def test_a_buffer_expires_its_ttl_after_its_end_and_is_renewed_seldom_while_it_streams(redis_url):
    """A list keeps its expiry as it grows: it is set at the first event, not again for the next few,
    and set afresh at the end; a stream past a tenth of the TTL since it was set renews it."""
    import redis.asyncio as redis

    buffer = streaming.RedisReplayBuffer(redis_url, ttl_s=100)
    client = redis.Redis.from_url(redis_url)
    generation_id = str(uuid.uuid4())
    key = f"chatsite:stream:{generation_id}"
    try:
        await buffer.append(generation_id, {"type": "generation.delta", "text": "a", "seq": 1})
        assert 99 <= await client.ttl(key) <= 100
        await client.expire(key, 50)  # as if time had passed; the next delta leaves it be
        await buffer.append(generation_id, {"type": "generation.delta", "text": "b", "seq": 2})
        assert await client.ttl(key) <= 50
        buffer._renewed[generation_id] -= 11  # a tenth of the TTL and more since it was set
        await buffer.append(generation_id, {"type": "generation.delta", "text": "c", "seq": 3})
        assert await client.ttl(key) >= 99
        await client.expire(key, 50)
        await buffer.append(generation_id, {"type": "generation.done", "seq": 4})
        assert await client.ttl(key) >= 99
        assert generation_id not in buffer._renewed
        assert [e["seq"] for e in await buffer.read(generation_id, 0)] == [1, 2, 3, 4]
    finally:
        await client.delete(key)
        await client.aclose()


async def test_a_stopped_stream_still_sends_the_event_it_had_handed_over(redis_url):
    """An event has its `seq` once handed over: a stop that cancels the stream meanwhile must not
    leave a hole in the buffer that followers would wait on."""
    buffer = streaming.RedisReplayBuffer(redis_url, ttl_s=60)
    generation_id = str(uuid.uuid4())
    sending = asyncio.ensure_future(buffer.append(generation_id, {"type": "generation.delta", "seq": 1}))
    await asyncio.sleep(0)  # handed over, not yet sent
    sending.cancel()
    await asyncio.wait_for(buffer.append(generation_id, {"type": "generation.delta", "seq": 2}), timeout=5)
    assert [e["seq"] for e in await buffer.read(generation_id, 0)] == [1, 2]
    assert sending.cancelled()


async def test_a_failed_send_reaches_each_of_its_callers_and_the_next_one_is_tried_afresh():
    import redis.exceptions

    buffer = streaming.RedisReplayBuffer("redis://127.0.0.1:1/0", ttl_s=60)  # nothing listens there
    results = await asyncio.gather(
        *(buffer.append(str(uuid.uuid4()), {"type": "generation.delta", "seq": 1}) for _ in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(result, redis.exceptions.ConnectionError) for result in results), results
    # Not stuck behind the failed pipeline: the next event is sent (and fails) on its own.
    with pytest.raises(redis.exceptions.ConnectionError):
        await asyncio.wait_for(buffer.append(str(uuid.uuid4()), {"type": "generation.delta", "seq": 1}), timeout=5)


@pytest.fixture
def restart_forgotten(monkeypatch):
    """A test that asks this process to restart its streams leaves the next test's streams alone."""
    import weakref

    monkeypatch.setattr(streaming, "_restart_requested", False)
    monkeypatch.setattr(streaming, "_restart_events", weakref.WeakKeyDictionary())


async def test_a_follower_ends_at_once_when_the_server_is_asked_to_stop(restart_forgotten):
    publisher, events, first = await _followed_from_its_first_text(coalesce_ms=0)
    waiting = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.1)

    streaming.streams_end_for_restart()  # as the stop signal's handler does, from outside the loop

    with pytest.raises(streaming.ServerRestarting) as restart:
        await asyncio.wait_for(waiting, timeout=2)
    assert restart.value.last_seq == {publisher.generation_id: first["seq"]}
    # A stream followed after the signal ends before its first event.
    with pytest.raises(streaming.ServerRestarting):
        await anext(follow_streams([publisher.generation_id], idle_timeout=10))


def test_the_embedded_default_keeps_one_replay_buffer_for_the_process(settings):
    """Its buffer is in memory: a new one for each caller would lose every event a follower had not
    read yet, and a stream whose live delivery skipped one would wait for it for ever."""
    from inference.streaming.streams import replay_buffer

    settings.REDIS_URL = ""
    assert replay_buffer() is replay_buffer()


async def test_log_probabilities_are_coalesced_with_their_text_and_kept_in_the_buffer():
    """A step may bring a token and no text (the end of text, half a character): its log
    probability still goes out, with the next text or at the flush."""
    publisher = StreamPublisher(uuid.uuid4(), coalesce_ms=10_000, coalesce_chars=10_000)
    hello = {"token": "Hello", "logprob": -0.1, "top": []}
    there = {"token": " there", "logprob": -0.2, "top": [[" there", -0.2]]}
    end = {"token": "<|im_end|>", "logprob": -0.3, "top": []}
    await publisher.add_text("Hello", logprobs=[hello])  # the first text goes out at once
    await publisher.add_text(" there", logprobs=[there])
    await publisher.add_text("", logprobs=[end])
    await publisher.flush()
    await publisher.add_text("")  # nothing: no event
    await publisher.flush()
    events = await replay_buffer().read(publisher.generation_id, 0)
    assert [(e["text"], e["logprobs"]) for e in events] == [("Hello", [hello]), (" there", [there, end])]


async def test_coalesced_text_goes_out_when_its_time_is_up_without_waiting_for_more():
    """An engine that pauses mid-answer (a long prefill beside it) holds back no text for long: what
    is pending goes out twice `coalesce_ms` after it came at most, whether or not more text comes."""
    publisher = StreamPublisher(uuid.uuid4(), coalesce_ms=50, coalesce_chars=10_000)
    await publisher.add_text("Hello")  # the first text goes out at once
    await publisher.add_text(" there")
    buffered = await replay_buffer().read(publisher.generation_id, 0)
    assert [e["text"] for e in buffered] == ["Hello"]
    await asyncio.sleep(0.3)
    buffered = await replay_buffer().read(publisher.generation_id, 0)
    assert [(e["seq"], e["text"]) for e in buffered] == [(1, "Hello"), (2, " there")]


async def test_once_the_engines_stream_has_ended_pending_text_goes_only_with_the_end():
    """After the stream ends (stopped, or its row ended elsewhere) no timer sends text on its own:
    what is left goes with `finish`, just before the end, or not at all."""
    publisher = StreamPublisher(uuid.uuid4(), coalesce_ms=50, coalesce_chars=10_000)
    await publisher.add_text("Hello")
    await publisher.add_text(" there")
    publisher.stream_ended()
    await asyncio.sleep(0.3)
    assert [e["text"] for e in await replay_buffer().read(publisher.generation_id, 0)] == ["Hello"]
    await publisher.finish(status="stopped", finish_reason="abort", usage=usage(1, 2))
    buffered = await replay_buffer().read(publisher.generation_id, 0)
    assert [(e["seq"], e["type"], e.get("text")) for e in buffered] == [
        (1, "generation.delta", "Hello"),
        (2, "generation.delta", " there"),
        (3, "generation.done", None),
    ]


async def test_a_timed_send_that_failed_fails_the_streams_next_step(monkeypatch):
    """The timer's send is the stream's own: when it fails, the reader of the engine's stream hears
    of it at its next step, as it would have from a send of its own."""
    publisher = StreamPublisher(uuid.uuid4(), coalesce_ms=50, coalesce_chars=10_000)
    await publisher.add_text("Hello")

    async def unreachable(*args, **kwargs):
        raise ConnectionError("Redis is away")

    monkeypatch.setattr(publisher, "_publish", unreachable)
    await publisher.add_text(" there")
    await asyncio.sleep(0.3)
    with pytest.raises(ConnectionError):
        await publisher.add_text(" again")
