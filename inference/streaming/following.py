"""Following a generation's stream: every event once, in order, whatever live delivery loses.

One protocol for every follower: the chat socket (conversations/consumers.py) and the responses
that stream server-sent events (the OpenAI-compatible API, the conversations API; `follow_streams`).
A follower joins the stream's group *before* it reads the replay buffer and drops any `seq` it has
already passed, so joining mid-stream never misses or repeats text; takes from the buffer what live
delivery skipped (a `seq` beyond the next one); and, once a stream has been quiet for a while, looks
in the buffer and then at the stream's row for an end that never arrived (streams.py says why each
of these can happen). `StreamFollower` holds that protocol; its owner decides only where the events
go and when to look at quiet streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from chatsite.database import db_async
from inference.services import generations_request_stop
from inference.streaming import streams
from inference.streaming.streams import TERMINAL_EVENTS, ServerRestarting, generation_group, restarting_event

logger = logging.getLogger(__name__)


class StreamFollower:
    """The streams one follower follows on one channel, and the `seq` it has passed on of each.

    Every event goes through `forward` (live ones, replayed ones, ones a resync found), which hands
    each to `deliver` exactly once, in `seq` order per stream. A stream is followed from `join` until
    its end is delivered: then its group is left and its `seq` forgotten, so following it again (a
    resume of an answer that has ended) replays it from where the new request says.
    """

    def __init__(self, *, layer: Any, channel: str, deliver: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.layer = layer
        self.channel = channel
        self._deliver = deliver
        self.last: dict[str, int] = {}  # generation id -> the last seq passed on, while it is followed
        self._heard: dict[str, float] = {}  # generation id -> when its last event was passed on
        self._forwarding = asyncio.Lock()  # one event at a time, in seq order
        self._closed = False

    def follows(self, generation_id: str) -> bool:
        return generation_id in self.last

    async def join(self, generation_id: str, *, after_seq: int = 0) -> None:
        """Join the stream's group, as having passed on `after_seq` (or more, if it already has)."""
        self.last[generation_id] = max(after_seq, self.last.get(generation_id, 0))
        self._heard[generation_id] = time.monotonic()
        await self.layer.group_add(generation_group(generation_id), self.channel)

    async def replay(self, generation_id: str, *, or_nothing: bool = False) -> bool:
        """Forward what the replay buffer holds of this stream; False when it holds nothing.
        `or_nothing`: a buffer that cannot be read counts as empty instead of raising."""
        read = streams.events_after_or_nothing if or_nothing else streams.events_after
        buffered = await read(generation_id, 0)
        for event in buffered:
            await self.forward(event)
        return bool(buffered)

    async def follow(
        self,
        generation_id: str,
        *,
        after_seq: int,
        fresh: bool,
        read_row: Callable[[], Awaitable[Any]],
    ) -> None:
        """Join the stream, then replay what was missed: a follower's resume.

        `fresh`: the generation was queued by this very request, so whatever it has published
        before the join is in the buffer, which cannot have expired yet, and the rest comes live.
        Its row (`read_row`) is not read: that read would wait behind other requests' database calls
        while the first text is already here."""
        await self.join(generation_id, after_seq=after_seq)
        buffered = await self.replay(generation_id)
        if not self.follows(generation_id) or fresh:
            return  # ended by what the buffer held, or all of it will come live
        if buffered:
            # The buffer had some of it but not its end. A page asks again when a stream has been
            # quiet for a few seconds: an answer that ended without its end reaching the buffer
            # ends now, from its row, instead of at the next quiet-stream round.
            for event in await streams.ends_from_rows({generation_id: self.last[generation_id]}):
                await self.forward(event)
            return
        generation = await read_row()
        if not generation.is_finished:
            return  # not begun yet: all of it will come live
        # Finished, and nothing was buffered when we looked: either the stream ran its whole course
        # while the row was read (its events are buffered now, its end is recorded before it is
        # announced), or it ended so long ago that its buffer expired, and then the row answers.
        if not await self.replay(generation_id):
            seq = self.last.get(generation_id, 0) + 1
            await self.forward(streams.final_event_from_row(generation, seq=seq))

    async def forward(self, event: dict[str, Any]) -> None:
        """Pass a stream's event on once, in order. A `seq` beyond the next one means live delivery
        skipped some (it delivers at most once): the ones between come from the replay buffer first."""
        if self._closed:
            return
        async with self._forwarding:
            generation_id: str = event.get("generation", "")
            last = self.last.get(generation_id)
            if last is not None and event["seq"] > last + 1:
                missed = await streams.events_after(generation_id, last, before_seq=event["seq"])
                if missed:
                    logger.warning("stream %s: live delivery skipped %d events", generation_id, len(missed))
                for event_missed in missed:
                    await self._pass_on(event_missed)
            await self._pass_on(event)

    async def _pass_on(self, event: dict[str, Any]) -> None:
        generation_id: str = event.get("generation", "")
        last = self.last.get(generation_id)
        if last is None or event["seq"] <= last:
            return
        self.last[generation_id] = event["seq"]
        self._heard[generation_id] = time.monotonic()
        await self._deliver(event)
        if event["type"] in TERMINAL_EVENTS:
            self.last.pop(generation_id, None)
            self._heard.pop(generation_id, None)
            await self.layer.group_discard(generation_group(generation_id), self.channel)

    async def resync_quiet(self, *, quiet_s: float = 0.0) -> None:
        """Look in the replay buffer for what the streams without an event for `quiet_s` may have
        lost live: an ending that live delivery dropped would otherwise leave the answer unfinished.
        One with nothing new there (or a buffer that cannot be read) is looked up by its row: an
        answer that ended without a word reaching the buffer ends from its row (`ends_from_rows`).
        Failures are logged, not raised: the next look tries again, and the follower lives on."""
        now = time.monotonic()
        silent = {}
        for generation_id in sorted(k for k in self.last if now - self._heard.get(k, now) >= quiet_s):
            self._heard[generation_id] = now
            try:
                found = await streams.events_after_or_nothing(generation_id, self.last.get(generation_id, 0))
                if found:
                    logger.warning("stream %s: %d events found only by the quiet resync", generation_id, len(found))
                else:
                    silent[generation_id] = self.last.get(generation_id, 0)
                for event in found:
                    await self.forward(event)
            except Exception:
                logger.exception("resyncing stream %s failed", generation_id)
        if not silent:
            return
        try:
            for event in await streams.ends_from_rows(silent):
                await self.forward(event)
        except Exception:
            logger.exception("reading the rows of quiet streams %s failed", ", ".join(silent))

    async def close(self) -> None:
        """Leave every stream's group and pass nothing more on."""
        self._closed = True
        for generation_id in list(self.last):
            await self.layer.group_discard(generation_group(generation_id), self.channel)
        self.last.clear()
        self._heard.clear()


# How much longer than an answer's time limit a follower waits without an event: time for the
# runner, or the reaper when a worker died, to end the answer and say so.
FOLLOW_GRACE_S = 60.0
# What a response that gave up on a silent stream tells its client.
FOLLOW_TIMEOUT_MESSAGE = "The answer took too long."
# What `follow_streams`' wait is handed when the process is asked to stop, and when it is time to look
# at the quiet streams.
_RESTART = object()
_LOOK = object()


async def follow_streams(
    generation_ids: list[str], *, idle_timeout: float | None = None
) -> AsyncGenerator[dict[str, Any], None]:
    """Every event of these generations, each exactly once and in order, until all have ended.

    `StreamFollower` on a fresh channel, for callers without a consumer of their own (the APIs'
    server-sent events): join each group, replay the buffers, then read live events, and every
    INFERENCE_STREAM_RESYNC_S look at the streams that have been quiet that long. Raises
    TimeoutError after `idle_timeout` seconds without an event (by default,
    INFERENCE_GENERATION_TIMEOUT_S + FOLLOW_GRACE_S), and ServerRestarting as soon as the process is
    asked to stop (`streams_end_for_restart`).
    """
    if idle_timeout is None:
        idle_timeout = settings.INFERENCE_GENERATION_TIMEOUT_S + FOLLOW_GRACE_S
    layer = get_channel_layer()
    channel = await layer.new_channel()
    passed = dict.fromkeys(generation_ids, 0)  # what a restart tells the caller each stream reached
    ready: list[dict[str, Any]] = []
    quiet_since = time.monotonic()

    async def collect(event: dict[str, Any]) -> None:
        nonlocal quiet_since
        passed[event["generation"]] = event["seq"]
        quiet_since = time.monotonic()
        ready.append(event)

    follower = StreamFollower(layer=layer, channel=channel, deliver=collect)
    resync_s = settings.INFERENCE_STREAM_RESYNC_S
    # One standing reader takes the channel's messages for as long as the response follows it and
    # hands them over (a cancelled receive gives the channel up, so none is cut short), and a timer
    # hands over a look at the quiet streams every INFERENCE_STREAM_RESYNC_S, as the chat socket's
    # does: an event costs no task, `asyncio.wait` or timer of its own. A restart is handed over the
    # same way.
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    async def read() -> None:
        try:
            while True:
                inbox.put_nowait(await layer.receive(channel))
        except Exception as exc:  # a channel layer that fails ends the response
            inbox.put_nowait(exc)

    async def look_regularly() -> None:
        while True:
            await asyncio.sleep(resync_s)
            inbox.put_nowait(_LOOK)

    helpers: list[asyncio.Future] = []
    restarting = restarting_event()
    restart = asyncio.ensure_future(restarting.wait())
    restart.add_done_callback(lambda waited: None if waited.cancelled() else inbox.put_nowait(_RESTART))
    try:
        for generation_id in generation_ids:
            await follower.join(generation_id)
        for generation_id in generation_ids:
            await follower.replay(generation_id, or_nothing=True)
        quiet_since = time.monotonic()
        helpers = [asyncio.ensure_future(read()), asyncio.ensure_future(look_regularly())]
        while ready or follower.last:
            if restarting.is_set():
                raise ServerRestarting(dict(passed))
            if ready:
                yield ready.pop(0)
                continue
            message = await inbox.get()
            if message is _RESTART:
                raise ServerRestarting(dict(passed))
            if isinstance(message, Exception):
                raise message
            if message is _LOOK:
                if time.monotonic() - quiet_since >= idle_timeout:
                    raise TimeoutError(f"no event for {idle_timeout:.0f} s")
                await follower.resync_quiet(quiet_s=resync_s)
                continue
            await follower.forward(message)
    finally:
        restart.cancel()
        for helper in helpers:  # the reader's cancelled receive gives the channel back to the layer
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        await follower.close()


@dataclass
class Following:
    ended: bool = False  # the response followed its streams to their ends


@contextlib.asynccontextmanager
async def stopped_if_abandoned(generation_ids: list[str]) -> AsyncIterator[Following]:
    """Around a response that follows `generation_ids`, from its first byte: unless it marks that it
    followed them to their ends (`following.ended = True`), the ones still running are stopped when
    it ends, so the engine spends no time on nobody. It ends early when the client goes away (the
    task is cancelled, or the response is closed at one of its yields, the first included), when
    `follow_streams` times out, or when it gives up on a failed stream."""
    following = Following()
    try:
        yield following
    finally:
        if not following.ended:
            await asyncio.shield(db_async(generations_request_stop)(generation_ids=generation_ids))
