"""The conversations API's side of the tool loop: an answer sent over the REST API that may call the
service's tools, driven in its event stream by the same `ToolLoops` the chat socket uses.

The stream listens on a channel of its own for its steps' events (each step's generation group) and
for what the person says through other requests: an approval (`POST .../tool-approvals/`) or a Stop
(`POST .../stop/`) is a message to the group of the step whose calls wait or run
(`tool_loop_group`), which the stream joined, so the request may reach any web process and still
find the one that holds the stream. The request waits for the stream's reply (`tool_loop_tell`):
only the stream knows whether a call still waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from accounts.models import User
from conversations.services import SentMessage
from conversations.tool_loops import ToolLoops, tool_steps_driven
from inference.models import Generation
from inference.streaming.following import FOLLOW_GRACE_S, StreamFollower
from inference.streaming.streams import ServerRestarting, restarting_event

logger = logging.getLogger(__name__)

# The events after which an answer's stream has nothing more to say.
ENDS = ("generation.done", "generation.error", "tool.stopped")
# How long a stream says nothing while a tool runs or a call waits for its approval before it sends a
# keep-alive (a comment line, which clients skip): a proxy that closes idle responses sooner than
# TOOLS_APPROVAL_TIMEOUT_S would otherwise end the answer while the person decides.
KEEPALIVE_S = 15.0
KEEPALIVE = {"type": "keep-alive"}
# How long a request to a stream waits for its reply: the channel layer's round trip, with room for
# a busy process. A stream that does not answer in that time is not there.
REPLY_TIMEOUT_S = 3.0


def tool_loop_group(generation_id: str) -> str:
    """The group of the stream that follows a step of an answer's tool loop."""
    return f"tools.{generation_id}"


async def tool_loop_tell(*, generation_id: str, message: dict[str, Any]) -> bool:
    """Tell the stream that follows `generation_id` something (`tool.approve`, `tool.stop`) and wait
    for its reply: True when it acted on it, False when it did not or no stream answered."""
    layer = get_channel_layer()
    reply_to = await layer.new_channel()
    receiving = asyncio.ensure_future(layer.receive(reply_to))
    try:
        await layer.group_send(tool_loop_group(generation_id), {**message, "reply_to": reply_to})
        reply = await asyncio.wait_for(receiving, timeout=REPLY_TIMEOUT_S)
    except TimeoutError:
        return False
    finally:
        receiving.cancel()
    return bool(reply.get("taken"))


class ToolStream:
    """One answer's events for an API send whose answer may call tools: its steps' streams (a
    delta's words only, as `ToolLoops.passed_on` passes them) and the loop's own frames, in order,
    until the answer ends (`ENDS`).

    `generations` is every step's generation so far: the response stops those still running when it
    ends before the answer does (`stopped_if_abandoned`, which reads it then). `answer_id`: the
    message of the step being written."""

    def __init__(self, *, user: User, sent: SentMessage) -> None:
        assert sent.generation is not None and sent.assistant_message is not None and sent.tools is not None
        self.sent = sent
        self.generations = [str(sent.generation.id)]
        self.answer_id = sent.assistant_message.id
        self.last_seq: dict[str, int] = {}
        self._ready: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._layer = get_channel_layer()
        self._channel = ""
        self._follower: StreamFollower | None = None
        self.loops = ToolLoops(user=user, send=self._ready.put, follow=self._follow_step)

    async def events(self) -> AsyncGenerator[dict[str, Any], None]:
        """The answer's events (its frames as the chat socket's). Raises TimeoutError when a step's
        stream is silent for longer than an answer may take, and ServerRestarting when the process
        is asked to stop; a running tool call or a question waiting for the person is bounded by
        the loop's own limits instead. Whenever it has been quiet for KEEPALIVE_S (a step queued, a
        tool running, a question waiting) it says `KEEPALIVE`. However it ends, the loop's running
        calls are cancelled (the step is marked stopped), as a closed socket's are."""
        sent = self.sent
        assert sent.generation is not None and sent.assistant_message is not None and sent.tools is not None
        self._channel = await self._layer.new_channel()
        self._follower = StreamFollower(layer=self._layer, channel=self._channel, deliver=self._deliver)
        idle_timeout = settings.INFERENCE_GENERATION_TIMEOUT_S + FOLLOW_GRACE_S
        resync_s = settings.INFERENCE_STREAM_RESYNC_S
        restarting = restarting_event()
        restart = asyncio.ensure_future(restarting.wait())
        # One receive for the channel at a time, kept across quiet spells (following.follow_streams).
        receiving: asyncio.Future | None = None
        getting: asyncio.Future | None = None
        try:
            await self.loops.start(
                plan=sent.tools,
                generation=sent.generation,
                answer_id=sent.assistant_message.id,
                user_message_id=sent.user_message.id,
                conversation_id=sent.conversation.id,
                project_id=sent.conversation.project_id,
            )
            await self._follow(sent.generation)
            quiet_since = said_at = time.monotonic()
            while True:
                getting = getting or asyncio.ensure_future(self._ready.get())
                receiving = receiving or asyncio.ensure_future(self._layer.receive(self._channel))
                done, _ = await asyncio.wait(
                    {getting, receiving, restart}, timeout=resync_s, return_when=asyncio.FIRST_COMPLETED
                )
                if restart in done:
                    raise ServerRestarting(dict(self.last_seq))
                if getting in done:
                    event, getting = getting.result(), None
                    quiet_since = said_at = time.monotonic()
                    if event["type"] == "tool.step":
                        self.answer_id = event["assistant_message"]["id"]
                    yield event
                    if event["type"] in ENDS:
                        return
                elif receiving in done:
                    message, receiving = receiving.result(), None
                    await self._received(message)
                else:
                    if self._follower.last:  # a step's stream has been quiet (none is followed while tools run)
                        if time.monotonic() - quiet_since >= idle_timeout:
                            raise TimeoutError(f"no event for {idle_timeout:.0f} s")
                        await self._follower.resync_quiet()
                    if time.monotonic() - said_at >= KEEPALIVE_S:  # a tool runs, a call waits, a step queues
                        said_at = time.monotonic()
                        yield KEEPALIVE
        finally:
            for pending in (restart, receiving, getting):
                if pending is not None:
                    pending.cancel()
            await asyncio.shield(self._close())

    async def _close(self) -> None:
        await self.loops.close()
        await tool_steps_driven(generation_ids=self.generations, driven=False)
        if self._follower is not None:
            await self._follower.close()
        for generation_id in self.generations:
            await self._layer.group_discard(tool_loop_group(generation_id), self._channel)

    async def _deliver(self, event: dict[str, Any]) -> None:
        self.last_seq[event["generation"]] = event["seq"]
        passed = await self.loops.passed_on(event)
        if passed is not None:
            await self._ready.put(passed)

    async def _follow(self, generation: Generation) -> None:
        """Join the step's group (for the requests about its calls), then its stream: queued by this
        very request, so the buffer holds all it published before the join and the rest comes live."""
        generation_id = str(generation.id)
        await self._layer.group_add(tool_loop_group(generation_id), self._channel)
        # A page that follows the step meanwhile waits for this stream's calls (tool_loops.FollowedSteps).
        await tool_steps_driven(generation_ids=[generation_id], driven=True)
        assert self._follower is not None
        await self._follower.follow(
            generation_id, after_seq=0, fresh=True, read_row=lambda: Generation.objects.aget(id=generation_id)
        )

    async def _follow_step(self, generation: Generation) -> None:
        self.generations.append(str(generation.id))
        await self._follow(generation)

    async def _received(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind in ("generation.delta", "generation.done", "generation.error"):
            assert self._follower is not None
            await self._follower.forward(message)
            return
        if kind == "tool.approve":
            taken = self.loops.answer(
                generation_id=message.get("generation"), call_id=message.get("call"), decision=message.get("decision")
            )
        elif kind == "tool.stop":
            taken = await self.loops.stop(str(message.get("generation")))
        else:
            return
        reply_to = message.get("reply_to")
        if not isinstance(reply_to, str):
            return
        try:
            await self._layer.send(reply_to, {"type": "tool.reply", "taken": taken})
        except Exception:  # the request hears nothing and says so; the stream goes on
            logger.exception("replying to a %s for generation %s failed", kind, message.get("generation"))
