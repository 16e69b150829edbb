"""Token streaming onto the channel layer, with a short-lived replay buffer.

Protocol: every event for generation G goes to group "generation.G" with a `seq` that grows by one
per event. Each event is first appended to the replay buffer, then sent to the group (with Redis,
both in one round trip). A follower joins the group *before* reading the buffer and drops anything
with a `seq` it has already passed, so joining mid-stream (a reload, a second tab, a reconnect)
never misses or repeats text.

The buffer, not the channel layer, is what a follower relies on. Live delivery is the fast path and
may skip events: the pub/sub layer delivers at most once, so what is published while a subscription
is being made or a connection is down is lost. So a follower that receives a `seq` beyond the next
one first takes the ones between from the buffer (`events_after`), and one whose stream has gone
quiet for INFERENCE_STREAM_RESYNC_S looks there too, which is how an ending that live delivery
dropped still arrives. When the buffer has nothing new either (or cannot be read), the follower
reads the stream's row: a generation that ended without a word reaching the buffer (ended by
another process, or its buffer lost with Redis) still ends for whoever waits on it (`ends_from_rows`).
Followers keep to this protocol through one class, `following.StreamFollower`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings
from hiredis import pack_command
from redis.exceptions import ResponseError

from chatsite.batching import Batcher
from chatsite.database import db_async
from chatsite.redis_clients import redis_async_client
from inference.models import Generation
from inference.selectors import generations_finished
from inference.streaming.channels_redis_internals import group_channel, pubsub_on

logger = logging.getLogger(__name__)


def generation_group(generation_id: Any) -> str:
    return f"generation.{generation_id}"


ENGINE_STATUS_GROUP = "engine.status"


class ReplayBuffer(Protocol):
    async def append(self, generation_id: str, event: dict[str, Any]) -> None: ...

    async def append_and_publish(self, generation_id: str, event: dict[str, Any], layer: Any, group: str) -> bool:
        """Append `event`, then publish it to `group` of `layer`, in one step if this buffer can.
        Only appends, and returns False, when it cannot: the caller then sends to the group itself."""
        ...

    async def read(self, generation_id: str, after_seq: int) -> list[dict[str, Any]]: ...


class MemoryReplayBuffer:
    """The embedded default's buffer: one process, so a dict with expiry is enough."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._events: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    async def append(self, generation_id: str, event: dict[str, Any]) -> None:
        now = time.monotonic()
        _, events = self._events.get(generation_id, (now, []))
        events.append(event)
        self._events[generation_id] = (now, events)
        if len(self._events) > 256:
            self._expire(now)

    async def append_and_publish(self, generation_id: str, event: dict[str, Any], layer: Any, group: str) -> bool:
        await self.append(generation_id, event)
        return False

    async def read(self, generation_id: str, after_seq: int) -> list[dict[str, Any]]:
        _, events = self._events.get(generation_id, (0.0, []))
        return [event for event in events if event["seq"] > after_seq]

    def _expire(self, now: float) -> None:
        for key in [k for k, (touched, _) in self._events.items() if now - touched > self.ttl_s]:
            del self._events[key]


class RedisReplayBuffer:
    """A Redis list per generation, expiring a while after its last event.

    When the channel layer publishes on the same Redis server, an event's append and its publish go
    in one pipeline: one write and one round trip where there were two. Redis runs a pipeline's
    commands in order, so the event is in the buffer before any follower can receive it.

    The events of all streams on one event loop share pipelines too: an engine step hands every
    stream its next token at once, so with eight answers streaming, eight events go to Redis in one
    write instead of eight. The first event goes at once and those handed in while a pipeline is in
    flight go in the next, so a lone stream pays one round trip an event as before. An event that
    a stop cancels while it waits is still sent: it has its `seq`, and followers must never find a
    hole in the buffer.

    A list keeps its expiry as it grows, so it is renewed only at a stream's first event in this
    process, at its end, and otherwise at most every tenth of the TTL (RENEW_SHARE): a buffer lasts
    the TTL after its end, and at least nine tenths of it after the last event of a stream that
    never ended. Two commands an event where there were three.
    """

    RENEW_SHARE = 0.1

    def __init__(self, url: str, ttl_s: int) -> None:
        self.url = url
        self.ttl_s = ttl_s
        # Per event loop, held weakly: a loop's id can be reused after it is closed, the loop cannot.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._sends: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher] = weakref.WeakKeyDictionary()
        self._renewed: dict[str, float] = {}  # generation id -> when its expiry was last set, while it streams

    def _client(self) -> Any:
        # redis.asyncio connections belong to the loop that opened them; keep one client per loop.
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = redis_async_client(self.url)
        return client

    @staticmethod
    def _key(generation_id: str) -> str:
        return f"chatsite:stream:{generation_id}"

    async def append(self, generation_id: str, event: dict[str, Any]) -> None:
        await self._append(generation_id, event, publish=None)

    async def append_and_publish(self, generation_id: str, event: dict[str, Any], layer: Any, group: str) -> bool:
        pubsub = pubsub_on(layer, self.url)
        if pubsub is None:
            await self.append(generation_id, event)
            return False
        # The channel name and the payload exactly as the layer's own group_send makes them.
        await self._append(generation_id, event, publish=(group_channel(pubsub, group), layer.serialize(event)))
        return True

    async def _append(self, generation_id: str, event: dict[str, Any], *, publish: tuple[str, bytes] | None) -> None:
        key = self._key(generation_id)
        commands: list[tuple] = [("RPUSH", key, json.dumps(event))]
        if self._renew_due(generation_id, ended=event["type"] in TERMINAL_EVENTS):
            commands.append(("EXPIRE", key, self.ttl_s))
        if publish is not None:
            commands.append(("PUBLISH", *publish))
        loop = asyncio.get_running_loop()
        sends = self._sends.get(loop)
        if sends is None:
            sends = self._sends[loop] = Batcher(_Pipelines(self._client()))
        await sends.submit(commands)

    def _renew_due(self, generation_id: str, *, ended: bool) -> bool:
        now = time.monotonic()
        renewed = self._renewed.get(generation_id)
        if ended:
            self._renewed.pop(generation_id, None)
            return True
        if renewed is not None and now - renewed < self.ttl_s * self.RENEW_SHARE:
            return False
        if len(self._renewed) >= 4096:  # streams whose end was published elsewhere, or never
            for key in [k for k, at in self._renewed.items() if now - at >= self.ttl_s * self.RENEW_SHARE]:
                del self._renewed[key]
        self._renewed[generation_id] = now
        return True

    async def read(self, generation_id: str, after_seq: int) -> list[dict[str, Any]]:
        raw = await self._client().lrange(self._key(generation_id), 0, -1)
        events = [json.loads(item) for item in raw]
        return [event for event in events if event["seq"] > after_seq]


class _Pipelines:
    """A loop's pipelines to the buffer's Redis: each batch of commands packed at once (hiredis's packer, in C)
    and written in one write on one connection, its replies read back in order.

    redis-py's own pipeline packs each argument in Python and wraps the exchange in per-command
    bookkeeping, most of an event's CPU on the worker. Only one batch runs at a time on a loop
    (`Batcher`), so the connection is the loop's alone; a connection that fails is dropped and the
    whole batch sent again on a new one, under the client's retry policy (chatsite/redis_clients.py),
    as redis-py's pipeline does: an event twice in a buffer is one its followers drop by its `seq`.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._connection: Any = None

    async def __call__(self, batch: list[list[tuple]]) -> list[None | Exception]:
        payload = b"".join([pack_command(command) for commands in batch for command in commands])
        if self._connection is None:
            self._connection = await self._client.connection_pool.get_connection()
        connection = self._connection
        replies = await connection.retry.call_with_retry(
            lambda: self._exchange(connection, payload, sum(len(commands) for commands in batch)),
            lambda error: connection.disconnect(),
        )
        results: list[None | Exception] = []
        for commands in batch:
            errors = [reply for reply in replies[: len(commands)] if isinstance(reply, Exception)]
            replies = replies[len(commands) :]
            results.append(errors[0] if errors else None)
        return results

    @staticmethod
    async def _exchange(connection: Any, payload: bytes, count: int) -> list[Any]:
        await connection.send_packed_command(payload)
        replies: list[Any] = []
        for _ in range(count):  # every reply read, an error's too, so the next batch reads its own
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies


_buffer: ReplayBuffer | None = None


def replay_buffer() -> ReplayBuffer:
    global _buffer
    # A new one when REDIS_URL changes (a test pointing the process at a Redis of its own).
    # (The in-memory buffer has no URL, and REDIS_URL is empty then: the same buffer for the process.)
    if _buffer is None or (getattr(_buffer, "url", None) or None) != (settings.REDIS_URL or None):
        if settings.REDIS_URL:
            _buffer = RedisReplayBuffer(settings.REDIS_URL, settings.INFERENCE_REPLAY_TTL_S)
        else:
            _buffer = MemoryReplayBuffer(settings.INFERENCE_REPLAY_TTL_S)
    return _buffer


# Where a stream whose buffer was lost goes on (StreamPublisher.continuing): past any real `seq`.
LOST_STREAM_SEQ = 1_000_000_000


class StreamPublisher:
    """Publishes one generation's events, coalescing text deltas.

    The first text goes out at once (it is the user's time to first token); after that, text goes
    out with the first text that comes `coalesce_ms` after the last send, or once `coalesce_chars`
    have piled up, so a busy engine costs one channel-layer message per ~50 ms per stream rather
    than one per token. Text left pending waits for the engine's next step, or twice `coalesce_ms`
    at most: when that step is late (a long prefill beside this answer), a timer sends it. In a
    steady stream the next text always comes first, so the timer never fires (a timer sending by
    the window itself cost each process more a token and lagged more: docs/performance-relay.md).
    Once the engine's stream has ended (`stream_ended`) the timer is off: `finish` or `fail` sends
    what is left, and a run that ends neither way (its row ended elsewhere) sends nothing more.
    """

    def __init__(
        self, generation_id: Any, *, coalesce_ms: int | None = None, coalesce_chars: int | None = None
    ) -> None:
        self.generation_id = str(generation_id)
        self.group = generation_group(generation_id)
        self.coalesce_s = (settings.INFERENCE_STREAM_COALESCE_MS if coalesce_ms is None else coalesce_ms) / 1000
        self.coalesce_chars = settings.INFERENCE_STREAM_COALESCE_CHARS if coalesce_chars is None else coalesce_chars
        self.seq = 0
        self.text = ""
        self._pending = ""
        # The pending text's tokens' log probabilities, for a request that asked for them.
        self._pending_logprobs: list[dict[str, Any]] = []
        self._last_sent = 0.0
        self._layer = get_channel_layer()
        self._buffer = replay_buffer()
        self._timer: asyncio.TimerHandle | None = None  # sends the pending text when its time is up
        self._timed: asyncio.Task | None = None  # the timer's send, held while it runs
        self._timed_failure: BaseException | None = None  # why it failed, raised at the next call
        self._stream_ended = False

    @classmethod
    async def continuing(cls, generation_id: Any, *, ahead_if_lost: bool = False) -> StreamPublisher:
        """A publisher that carries on a stream someone else began (e.g. to end a dead worker's).

        `ahead_if_lost`: a stream whose buffer holds nothing (lost with a Redis restart, or never
        written) goes on from LOST_STREAM_SEQ, past any `seq` its followers can have seen: from 1
        they might drop its end as one they had passed, and hear of it only from its row, seconds
        later. A follower takes the jump for events live delivery skipped, and finds none."""
        publisher = cls(generation_id)
        events = await publisher._buffer.read(publisher.generation_id, 0)
        publisher.seq = max((event["seq"] for event in events), default=0)
        if ahead_if_lost and not events:
            publisher.seq = LOST_STREAM_SEQ - 1
        publisher.text = "".join(event.get("text", "") for event in events if event["type"] == "generation.delta")
        return publisher

    async def add_text(self, text: str, *, logprobs: list[dict[str, Any]] | None = None) -> None:
        """Add an engine step's text and, when asked for, its tokens' log probabilities (a step can
        bring tokens and no text yet: the end-of-text token, half of a character)."""
        if not text and not logprobs:
            return
        self.text += text
        self._pending += text
        self._pending_logprobs += logprobs or []
        now = time.monotonic()
        if (
            self._timed_failure is not None
            or self.seq == 0
            or now - self._last_sent >= self.coalesce_s
            or len(self._pending) >= self.coalesce_chars
        ):
            await self.flush()
        elif self._timer is None and not self._stream_ended:
            self._timer = asyncio.get_running_loop().call_later(2 * self.coalesce_s, self._time_up)

    def _time_up(self) -> None:
        self._timer = None
        if self._timed is None and not self._stream_ended:
            self._timed = asyncio.ensure_future(self._timed_send())
            self._timed.add_done_callback(self._timed_done)

    async def _timed_send(self) -> None:
        if not self._stream_ended:
            await self._send_pending()

    def _timed_done(self, task: asyncio.Task) -> None:
        self._timed = None
        if not task.cancelled() and task.exception() is not None:
            self._timed_failure = task.exception()

    def stream_ended(self) -> None:
        """The engine's stream has ended (or been stopped): no timer sends text from here on. What is
        pending goes with `finish` or `fail`, as the end's text must come before the end itself."""
        self._stream_ended = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def flush(self) -> None:
        """Send the pending text now. Raises what made the timer's last send fail, if it did: the
        stream's reader hears of it as it would have from a send of its own."""
        if self._timed_failure is not None:
            failure, self._timed_failure = self._timed_failure, None
            raise failure
        await self._send_pending()

    async def _send_pending(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending and not self._pending_logprobs:
            return
        event: dict[str, Any] = {"type": "generation.delta", "text": self._pending}
        if self._pending_logprobs:
            event["logprobs"] = self._pending_logprobs
        self._pending, self._pending_logprobs = "", []
        self._last_sent = time.monotonic()
        await self._publish(event)

    async def finish(self, *, status: str, finish_reason: str, usage: dict[str, Any], text: str | None = None) -> None:
        """End the stream. `text`, when given, replaces what the client has shown (a content-filter cut)."""
        await self._send_pending()
        event: dict[str, Any] = {
            "type": "generation.done",
            "status": status,
            "finish_reason": finish_reason,
            "usage": usage,
        }
        if text is not None:
            event["text"] = text
        await self._publish(event)

    async def fail(self, *, code: str, message: str) -> None:
        await self._send_pending()
        await self._publish({"type": "generation.error", "code": code, "message": message})

    async def _publish(self, event: dict[str, Any]) -> None:
        self.seq += 1
        event = {**event, "generation": self.generation_id, "seq": self.seq}
        if not await self._buffer.append_and_publish(self.generation_id, event, self._layer, self.group):
            await self._layer.group_send(self.group, event)


async def engine_status_broadcast(deployment: str, state: str) -> None:
    layer = get_channel_layer()
    await layer.group_send(ENGINE_STATUS_GROUP, {"type": "engine.status", "deployment": deployment, "state": state})


TERMINAL_EVENTS = ("generation.done", "generation.error")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """Token counts as a stream's end carries them, in the shape OpenAI reports them (a `/v1` body
    carries them as they are: `inference.openai.wire`). `cached_tokens`: of the prompt's, those the engine's prefix cache served (vLLM's count)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


async def stream_end_announce(generation: Generation) -> None:
    """Tell a stream's followers of its end when no runner will: an answer ended before an engine
    took it (stopped while queued, its owner deactivated)."""
    publisher = await StreamPublisher.continuing(generation.id)
    counts = usage(generation.prompt_tokens, generation.completion_tokens, generation.cached_tokens)
    await publisher.finish(status=generation.status, finish_reason=generation.finish_reason, usage=counts)


def final_event_from_row(generation: Generation, *, seq: int) -> dict[str, Any]:
    """A finished generation's end as its stream announced it, with its whole text, from its row: for
    a follower that finds its stream's buffer gone."""
    event: dict[str, Any]
    if generation.status == Generation.Status.FAILED:
        event = {"type": "generation.error", "code": generation.error_code, "message": generation.error_message}
    else:
        event = {
            "type": "generation.done",
            "status": generation.status,
            "finish_reason": generation.finish_reason,
            "usage": usage(generation.prompt_tokens, generation.completion_tokens, generation.cached_tokens),
        }
    return {**event, "generation": str(generation.id), "seq": seq, "text": generation.text}


async def events_after(generation_id: str, after_seq: int, *, before_seq: int | None = None) -> list[dict[str, Any]]:
    """The buffered events of a stream after `after_seq` (and before `before_seq`), in `seq` order."""
    events = await replay_buffer().read(generation_id, after_seq)
    return sorted(
        (event for event in events if before_seq is None or event["seq"] < before_seq), key=lambda e: e["seq"]
    )


async def events_after_or_nothing(generation_id: str, after_seq: int) -> list[dict[str, Any]]:
    """`events_after`, or nothing when the buffer cannot be read (Redis down or restarting): for a
    follower's look at a quiet stream, which then asks the stream's row instead (`ends_from_rows`)."""
    try:
        return await events_after(generation_id, after_seq)
    except Exception as exc:  # one line a look, not a traceback: Redis may stay away for minutes
        logger.warning("stream %s: its replay buffer cannot be read (%r)", generation_id, exc)
        return []


async def ends_from_rows(last_seqs: dict[str, int]) -> list[dict[str, Any]]:
    """For streams that have gone quiet with nothing new in the buffer (`last_seqs`: each one's id and
    the last `seq` its follower passed on): the events that end those whose row says they have ended.

    A generation can end without its end reaching the buffer: ended by another process, whose
    channel layer this one does not share (two embedded servers on one database); ended in the
    database by a reaper that could not read or write the buffer; or its buffer lost with a Redis
    restart, so the end was published with a `seq` the follower had already passed. Its row holds
    all of it. The buffer is read once more after the row, since an end is recorded before it is
    announced: an end published meanwhile is passed on as it is, else it is made from the row, with
    the row's whole text for the follower to show (`final_event_from_row`)."""
    events: list[dict[str, Any]] = []
    for generation in await db_async(generations_finished)(ids=list(last_seqs)):
        generation_id = str(generation.id)
        found = await events_after_or_nothing(generation_id, last_seqs[generation_id])
        if not any(event["type"] in TERMINAL_EVENTS for event in found):
            logger.warning("stream %s ended without announcing it; its end comes from its row", generation_id)
            seq = max([last_seqs[generation_id], *(event["seq"] for event in found)]) + 1
            found.append(final_event_from_row(generation, seq=seq))
        events += found
    return events


class ServerRestarting(Exception):  # noqa: N818 - a condition, as TimeoutError is
    """This web process is shutting down: a stream it follows ends here, while its answer runs on
    (on its worker, in the production topology). `last_seq`: each stream's last event passed on."""

    def __init__(self, last_seq: dict[str, int]) -> None:
        super().__init__("the server is restarting")
        self.last_seq = last_seq


# What a response that a restart ended tells its client.
RESTARTING_MESSAGE = "The server is restarting. Send the same request again (same client_id) to resume."

_restart_requested = False
# Per event loop, held weakly (as the Redis clients are): what its streams wait on.
_restart_events: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = weakref.WeakKeyDictionary()


def streams_end_for_restart() -> None:
    """Tell every stream this process follows that it is shutting down: each ends at once with
    ServerRestarting, instead of holding the shutdown until its answer ends. Safe from a signal
    handler and from any thread."""
    global _restart_requested
    _restart_requested = True
    for loop, event in list(_restart_events.items()):
        if not loop.is_closed():
            loop.call_soon_threadsafe(event.set)


def restarting_event() -> asyncio.Event:
    """What this event loop's followers wait on to hear that the process is shutting down."""
    loop = asyncio.get_running_loop()
    event = _restart_events.get(loop)
    if event is None:
        event = _restart_events[loop] = asyncio.Event()
        if _restart_requested:
            event.set()
    return event
