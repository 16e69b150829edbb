"""The chat socket.

Client → server: `message.send` {content, conversation?, model?, client_id?, retry?, parent?}, `generation.stop`
{generation}, `generation.resume` {generation, after_seq}, `message.regenerate` {message, replaces?, model?},
`message.continue` {message, replaces?}, `tool.approve` {generation, call, decision}.
Server → client: `conversation.created`, `message.accepted` (its `user_message` with its `parent` and `siblings`),
`message.regenerating` {regenerated, assistant_message {id, parent, siblings, text_before?}, generation, model, replayed?},
`message.continuing` {assistant_message, generation, model, replayed?}, `generation.delta` {seq, text},
`generation.done` {seq, status, finish_reason, usage, cost, conversation_usage, quota}, `generation.error` {seq, code, message},
`engine.status` {deployment, state}, `conversation.title` {conversation, title} when a title is
written or changed, `conversation.summary` {conversation, through, text} when a summary of its earlier
messages is ready, `conversation.message` {conversation, created, user_message, assistant_message?,
generation?, blocked?} for a message another of the user's sockets sent, `message.blocked` {conversation, user_message, message} when
moderation holds a message back (it is saved, flagged, and never reaches the model), and `error`
{code, message, client_id?} for a refused request; and the tool loop's frames (`tool.calls`,
`tool.approval`, `tool.running`, `tool.result`, `tool.step`, `tool.stopped`: conversations.tool_loops)
for an answer that may call the service's tools (`message.send`'s `tools` and `tool`, docs/tools.md),
which the user's other sockets hear too, marked `elsewhere`, with `tool.ended` for a loop that ended
with the socket that drove it.

A send's `client_id` (a UUID the client makes) is echoed in its `message.accepted`,
`message.blocked` or `error`, and makes the send safe to repeat: a client whose socket dropped
before it heard one of them sends the same frame again on its next socket, with `retry: true`, and
is answered with the message its first send saved and that message's answer, from the start of its
stream; nothing is saved, charged or generated twice (`message_send`).

A socket lives only as long as its user may use the service. Suspension or deactivation closes all
of the user's sockets with code 4403 and stops what they have running; signing out closes that
session's sockets, and a new password the sockets of every session signed in with the old one,
with code 4401; the generations a closed socket started are stopped. These arrive as a `user.access`
event on the user's group (accounts.services.user_access_changed), from whichever process made
the change. Each frame is also checked against the account and session as they stand
(accounts.selectors.session_access, at most every ACCESS_RECHECK_S), so a lost event still lets
no frame through; nothing is read from a socket once it is closed.

Messages form a tree (conversations.branches): a send's `parent` is the message it follows (an
answer; null starts a branch from the beginning; left out, the branch on screen), so an edited
message is a send beside the one it edits. A regenerate adds an answer beside the one it names,
written by its `model` when it names one (checked against the plan as a send's is).

A regenerate's `replaces` (the generation of the newest answer to that question the client knows
of) makes it safe to repeat the same way: once a newer answer exists, the request is answered with
it (`message.regenerating` with `replayed: true`) and queues nothing (`message_regenerate`). Two
tabs that ask at once get one new answer between them. A continue's `replaces` (the generation the
client shows in the answer it continues) does the same for `message.continuing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, ClassVar, ParamSpec, TypeVar

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY
from django.db import DatabaseError

import chatsite.request_context as request_context
from accounts.metering import ADMITTED, Metering, metered, request_meter
from accounts.selectors import SessionAccess, session_access, session_key_digest
from accounts.services import user_group
from accounts.signals import request_refused
from accounts.sockets import socket_place_give_back, socket_place_take
from chatsite.database import DatabaseCall, db_async, reconnecting
from chatsite.errors import ClientError
from chatsite.parsers import json_parse
from conversations.costs import generation_done_costs
from conversations.requests import AnswerRequest, SendRequest, is_integer
from conversations.services import (
    Regenerated,
    SentMessage,
    message_continue,
    message_regenerate,
    message_send,
    message_send_checked,
)
from conversations.tool_loops import LOOP_ENDED, FollowedSteps, ToolLoops, tool_steps_driven
from inference.execution.dispatch import engine_state
from inference.models import Generation
from inference.selectors import generation_get_for_user, generation_writer
from inference.services import generation_request_stop
from inference.streaming.following import StreamFollower
from inference.streaming.streams import ENGINE_STATUS_GROUP, TERMINAL_EVENTS, stream_end_announce

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

MAX_FRAME_BYTES = 256 * 1024
# How long a passed access check stands for the frames after it: a burst (a reconnect resuming its
# streams) costs one read, and a change still reaches each socket by its event within milliseconds.
ACCESS_RECHECK_S = 0.3
# Close codes: the session has ended (signed out, a new password), the account may not be used.
CLOSE_SESSION_ENDED = 4401
CLOSE_ACCOUNT_SUSPENDED = 4403
CLOSE_CODES = {SessionAccess.ENDED: CLOSE_SESSION_ENDED, SessionAccess.SUSPENDED: CLOSE_ACCOUNT_SUSPENDED}
# The user has CHAT_SOCKETS_PER_USER sockets open already (accounts/sockets.py): the page says so and
# tries again later, when one of the others may have closed.
CLOSE_TOO_MANY_SOCKETS = 4429


class _ClientGone(Exception):
    """The client closed the socket: nothing more can be sent on it. ASGI servers raise a subclass of
    OSError on a send to a closed connection (uvicorn's `ClientDisconnected`)."""


# Per frame type: a message's sending, regenerating and continuing are charged by request_admit (the
# plan's requests and tokens a minute); stopping and resuming a stream count as plain requests.
@metered("request", **{"message.send": ADMITTED, "message.regenerate": ADMITTED, "message.continue": ADMITTED})
class ChatConsumer(AsyncJsonWebsocketConsumer):
    metering: ClassVar[Metering]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resync: asyncio.Future | None = None
        self._closed_for_access = False  # once set, nothing more is read from this socket
        self._access_checked_at = float("-inf")
        self._started: set[str] = set()  # generations this socket asked for, stopped if it is closed for access
        self._place: str | None = None  # this socket's id among its user's open sockets, while it holds a place
        self._place_kept: asyncio.Future | None = None
        self._client_left = False  # its disconnect read, or a send failed for it: nothing more is sent

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=CLOSE_SESSION_ENDED)
            return
        # The session the user signed in with (AuthMiddlewareStack has loaded it): what each frame's
        # access check compares, and how a sign-out names the sockets it closes.
        session = self.scope["session"]
        self._session_key = session.session_key or ""
        self._session_hash = session.get(HASH_SESSION_KEY, "")
        self._session_digest = session_key_digest(self._session_key)
        socket_id = uuid.uuid4().hex
        if not await socket_place_take(user_id=self.user.id, socket_id=socket_id):
            # Accepted, then closed: a browser is told the code and the reason only on an open socket.
            await self.accept()
            await self._close_too_many()
            return
        self._place = socket_id
        self._place_kept = asyncio.ensure_future(self._place_keep())
        self.streams = self._stream_follower()
        self.tools = ToolLoops(user=self.user, send=self._tool_send, follow=self._follow_step)
        self.followed = FollowedSteps()
        self._driving: list[str] = []  # the tool-loop steps this socket has driven
        # Joined before the accept: a change from here on reaches this socket by its event.
        await self.channel_layer.group_add(user_group(self.user.id), self.channel_name)
        await self.accept()
        self._resync = asyncio.ensure_future(self._resync_quiet_streams())
        await self.channel_layer.group_add(ENGINE_STATUS_GROUP, self.channel_name)
        deployment = settings.INFERENCE_DEFAULT_DEPLOYMENT
        state = await db_async(engine_state)(deployment)
        await self.send_json({"type": "engine.status", "deployment": deployment, "state": state})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """channels' consumer, whose background tasks end with it however it ends.

        `disconnect` cancels them when the client goes, but a consumer that ends otherwise (an
        exception out of a handler, a server closing the socket) is never told of a disconnect,
        and its resync would go on looking for its streams every few seconds for the life of the
        process."""
        try:
            await self._consume(scope, receive, send)
        finally:
            if self._resync is not None:
                self._resync.cancel()
            await self._place_give_back()

    async def _consume(self, scope: Any, receive: Any, send: Any) -> None:
        """channels' `AsyncConsumer.__call__`, with one standing reader for each source.

        channels waits on the client and the channel layer with a new task for each message and an
        `asyncio.wait` over both: a task and its bookkeeping for every delta a socket forwards. Here
        each source has one reader for the socket's life, which hands what it reads to this loop;
        the handlers still take their messages one at a time, in the order they came. About half
        the CPU a message (docs/performance-relay.md). A reader only ever waits on its source, so
        cancelling it at the end unsubscribes the socket's channel, as channels' own does."""
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        self.base_send = self._send_while_open(send)
        handed: asyncio.Queue[dict[str, Any] | Exception] = asyncio.Queue()

        async def read(source: Callable[[], Awaitable[dict[str, Any]]]) -> None:
            try:
                while True:
                    message = await source()
                    left = message.get("type") == "websocket.disconnect"
                    self._client_left = self._client_left or left
                    handed.put_nowait(message)
                    if left:
                        # The client is gone, and nothing more comes from it: uvicorn answers every
                        # receive after a close with another disconnect, at once, so a reader that
                        # went on would never let the loop run again.
                        return
            except Exception as exc:  # a source that fails ends the consumer, as in channels
                handed.put_nowait(exc)

        readers = [asyncio.ensure_future(read(receive)), asyncio.ensure_future(read(self.channel_receive))]
        try:
            while True:
                message = await handed.get()
                if isinstance(message, Exception):
                    raise message
                try:
                    await self.dispatch(message)
                except _ClientGone:
                    # What a handler did stays done (a send saved, an answer running); its client
                    # has left, and the disconnect still to come cleans up after the socket.
                    continue
        except StopConsumer:
            pass
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    def _send_while_open(
        self, send: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> Callable[[dict[str, Any]], Awaitable[None]]:
        """The server's `send`, raising `_ClientGone` once the client has left: its disconnect read
        (the server refuses sends after it), or a send the server failed for it. A client that leaves
        while its request is carried out (at hundreds of sockets, every minute) ends the request
        quietly, not with a traceback and an error frame no one reads."""

        async def send_while_open(message: dict[str, Any]) -> None:
            if self._client_left:
                raise _ClientGone
            try:
                await send(message)
            except OSError as exc:
                self._client_left = True
                raise _ClientGone from exc

        return send_while_open

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        """Close the socket; nothing to do once its client has left (what follows a close, such as
        stopping a suspended user's answers, still runs)."""
        with contextlib.suppress(_ClientGone):
            await super().close(code=code, reason=reason)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """channels' dispatch, without its database check before every event.

        channels runs `close_old_connections` on the process's one shared sync thread before each
        handler: a hop to that thread for every delta a socket forwards, waiting behind whatever sync
        work is queued there. This consumer never uses that thread's connections; its database calls
        go through `db_async`, which checks the connection of the thread it runs on
        (chatsite/database.py). A closing socket still gets channels' check (`websocket_disconnect`).
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def disconnect(self, code: int) -> None:
        await self._place_give_back()
        if not hasattr(self, "streams"):
            return
        if self._resync is not None:
            self._resync.cancel()
        await self.channel_layer.group_discard(user_group(self.user.id), self.channel_name)
        await self.channel_layer.group_discard(ENGINE_STATUS_GROUP, self.channel_name)
        await self.streams.close()
        await self._tools_close()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if self._closed_for_access or not await self._access_holds():
            return
        if text_data is None or len(text_data) > MAX_FRAME_BYTES:
            await self._error("invalid_request", f"Send JSON text frames of at most {MAX_FRAME_BYTES // 1024} KB.")
            return
        try:
            # The site's one parser: strict JSON, nesting bounded, so nothing below recurses deeply.
            content = json_parse(text_data)
        except ClientError as exc:
            await self._error(exc.code, exc.message)
            return
        if not isinstance(content, dict):
            await self._error("invalid_request", "Send a JSON object with a 'type'.")
            return
        await self.receive_json(content)

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        request_context.request_begin(channel_name="chat")  # each request on the socket has its own id
        kind = content.get("type")
        name = kind if isinstance(kind, str) else ""
        handler = {
            "message.send": self._message_send,
            "generation.stop": self._generation_stop,
            "generation.resume": self._generation_resume,
            "message.regenerate": self._message_regenerate,
            "message.continue": self._message_continue,
            "tool.approve": self._tool_approve,
        }.get(name)
        if handler is None:
            named = f" {kind[:100]!r}" if isinstance(kind, str) else ""
            await self._error("invalid_request", f"Unknown message type{named}.")
            return
        # A refused send names its `client_id` (when it is text), so the client knows which came back.
        client_id = content.get("client_id") if kind == "message.send" else None
        client_id = client_id if isinstance(client_id, str) else None
        try:
            actions = self.metering.actions_for(name)
            if actions != (ADMITTED,):
                # Repeated on a fresh connection if the database drops it (the plan is read before a
                # bucket is charged): a Stop must land even then.
                await _reconnecting(request_meter)(user=self.user, address="", actions=actions)
            await handler(content)
        except _ClientGone:
            raise
        except ClientError as exc:
            request_refused.send(type(self), status=exc.status, code=exc.code)
            await self._error(exc.code, exc.message, retry_after=exc.retry_after, client_id=client_id)
        except Exception as exc:
            logger.exception("chat socket: a %s request failed", kind)
            if kind == "message.send" or isinstance(exc, DatabaseError):
                # The request may have been carried out in part (a send saved before the database
                # went away). Say so, without the send's `client_id` (the page would take the message
                # back), and close: the page reconnects and repeats its pending send as a retry,
                # which is answered with what the first one saved, or saves it now.
                code = "unavailable" if isinstance(exc, DatabaseError) else "server_error"
                await self._error(code, "Something went wrong on the server. Reconnecting…")
                await self.close(code=1011)
                return
            # Anything else this code did not foresee must not take the socket, and the answers it
            # follows, down with it: the client hears that it failed, and the log says why.
            await self._error("internal_error", "The request failed.")

    # --- client requests ------------------------------------------------------------------------

    async def _message_send(self, content: dict[str, Any]) -> None:
        request = SendRequest.parse(content)
        # A send with a client_id is safe to repeat (message_send): one whose connection fails is
        # repeated on a fresh one, and so is the verdict's call after the commit (a conditional
        # release), so the message saved is answered with its `message.accepted`.
        call = _reconnecting_send(request) if request.client_id is not None else db_async
        # Scored once the send has committed its answer held: the engine starts on it meanwhile.
        sent = await message_send_checked(call, user=self.user, request=request, run_tools=True)
        if sent.conversation_created:
            await self.send_json(
                {
                    "type": "conversation.created",
                    "conversation": {"id": sent.conversation.id, "title": sent.conversation.display_title},
                }
            )
        user_message = {
            "id": sent.user_message.id,
            "content": sent.user_message.content,
            "parent": sent.user_message.parent_id,
            # A replayed send's are not looked up: the page shows them on its next load.
            "siblings": list(sent.siblings or (sent.user_message.id,)),
        }
        answer, generation = sent.assistant_message, sent.generation
        if answer is None or generation is None:  # held back by moderation
            await self.send_json(
                {
                    "type": "message.blocked",
                    "conversation": sent.conversation.id,
                    "user_message": user_message,
                    "message": sent.blocked_reason,
                    "client_id": content.get("client_id"),
                }
            )
            if not sent.replayed:
                await self._others_tell(sent, user_message)
            return
        accepted = {
            "type": "message.accepted",
            "conversation": sent.conversation.id,
            "user_message": user_message,
            "assistant_message": {"id": answer.id},
            "generation": str(generation.id),
            # The deployment its name was routed to (orchestration.routing): the model that writes it.
            "model": generation_writer(generation),
            "client_id": content.get("client_id"),
        }
        if sent.warning:
            accepted["warning"] = sent.warning
        if generation.cached:  # played back from the response cache (orchestration.cache)
            accepted["cached"] = True
        if sent.tools is not None and not sent.replayed:
            # Its steps are followed and its calls run by this socket (conversations.tool_loops).
            accepted["tools"] = sent.tools.as_json()
            await self.tools.start(
                plan=sent.tools,
                generation=generation,
                answer_id=answer.id,
                user_message_id=sent.user_message.id,
                conversation_id=sent.conversation.id,
                project_id=sent.conversation.project_id,
            )
            await self._drives(str(generation.id))
        self._started.add(str(generation.id))
        await self.send_json(accepted)
        # A replayed send's answer may have ended long ago, its events gone from the buffer.
        await self._follow(generation, after_seq=0, fresh=not sent.replayed)
        if not sent.replayed:
            await self._others_tell(sent, user_message)

    async def _others_tell(self, sent: SentMessage, user_message: dict[str, Any]) -> None:
        """Tell the user's other sockets (other tabs, other devices) of a message this one sent, after
        this socket's own answer is under way: a page showing its conversation adds the message and
        the answer's place and follows the stream (`generation.resume`), the others list it. Best
        effort: the message is saved whatever becomes of this."""
        event: dict[str, Any] = {
            "type": "conversation.message",
            "origin": self.channel_name,
            # An archived conversation stays out of the other pages' lists (it stays archived).
            "conversation": {
                "id": sent.conversation.id,
                "title": sent.conversation.display_title,
                "archived": sent.conversation.is_archived,
            },
            "created": sent.conversation_created,
            "user_message": user_message,
        }
        if sent.assistant_message is None or sent.generation is None:
            event["blocked"] = sent.blocked_reason
        else:
            event["assistant_message"] = {"id": sent.assistant_message.id}
            event["generation"] = str(sent.generation.id)
        try:
            await self.channel_layer.group_send(user_group(self.user.id), event)
        except Exception:
            logger.exception("telling the other sockets of user %s of a message failed", self.user.id)

    async def _message_regenerate(self, content: dict[str, Any]) -> None:
        request = AnswerRequest.parse(content, with_model=True)
        regenerated = await db_async(message_regenerate)(user=self.user, request=request)
        answer = regenerated.answer
        assistant_message: dict[str, Any] = {
            "id": answer.id,
            "parent": answer.parent_id,
            "siblings": regenerated.siblings,
        }
        if answer.text_before:
            # A replayed answer continued since: its generation's stream holds only the text after this.
            assistant_message["text_before"] = answer.text_before
        await self._answer_requeued(
            {"type": "message.regenerating", "regenerated": request.message_id, "assistant_message": assistant_message},
            regenerated,
        )

    async def _message_continue(self, content: dict[str, Any]) -> None:
        continued = await db_async(message_continue)(user=self.user, request=AnswerRequest.parse(content))
        await self._answer_requeued(
            {"type": "message.continuing", "assistant_message": {"id": continued.answer.id}}, continued
        )

    async def _answer_requeued(self, frame: dict[str, Any], requeued: Regenerated) -> None:
        frame["generation"] = str(requeued.generation.id)
        # The deployment writing it (orchestration.routing), as a send's `message.accepted` says.
        frame["model"] = generation_writer(requeued.generation)
        if requeued.replayed:
            frame["replayed"] = True
        self._started.add(str(requeued.generation.id))
        await self.send_json(frame)
        # A replayed request's answer may have ended long ago, its events gone from the buffer.
        await self._follow(requeued.generation, after_seq=0, fresh=not requeued.replayed)

    async def _generation_stop(self, content: dict[str, Any]) -> None:
        generation = await self._own_generation(content.get("generation"))
        if await self.tools.stop(str(generation.id)):  # an answer between its tool steps
            return
        await self._stop(generation)

    async def _tool_approve(self, content: dict[str, Any]) -> None:
        """The person's answer to a tool call that waits for it (conversations.tool_loops)."""
        await self.tools.approve(content)

    # --- the tool loops this socket drives, as the user's other sockets see them -----------------

    async def _tool_send(self, frame: dict[str, Any]) -> None:
        """A frame of a loop this socket drives: to its page, and to the user's other sockets, whose
        pages show the loop too (an `error` answers this socket's own request, and stays here)."""
        if frame["type"] != "error":
            await self._others_relay(frame)
        await self.send_json(frame)

    async def _others_relay(self, frame: dict[str, Any]) -> None:
        try:
            await self.channel_layer.group_send(
                user_group(self.user.id), {"type": "tool.relay", "origin": self.channel_name, "frame": frame}
            )
        except Exception:  # best effort: the other pages show the loop on their next load
            logger.exception("telling the other sockets of user %s of a tool loop failed", self.user.id)

    async def _drives(self, generation_id: str) -> None:
        self._driving.append(generation_id)
        await tool_steps_driven(generation_ids=[generation_id], driven=True)

    async def _tools_close(self) -> None:
        """The socket's loops end with it: the calls running are stopped (`tool.stopped`), and a step
        still being written finishes as an answer, which the other pages are told (`tool.ended`)."""
        streaming = self.tools.streaming()
        await self.tools.close()
        await tool_steps_driven(generation_ids=self._driving, driven=False)
        for generation_id in streaming:
            await self._others_relay({"type": "tool.ended", "generation": generation_id, "note": LOOP_ENDED})

    async def _stop(self, generation: Generation) -> None:
        ended = await _reconnecting(generation_request_stop)(generation=generation)
        if ended is not None:
            # No engine had it yet, so no runner will announce the end: announce it to every tab.
            await stream_end_announce(ended)

    async def _generation_resume(self, content: dict[str, Any]) -> None:
        after_seq = content.get("after_seq", 0)
        if not is_integer(after_seq) or after_seq < 0:
            raise ClientError("'after_seq' must be a non-negative integer.", code="invalid_request")
        generation = await self._own_generation(content.get("generation"))
        key = str(generation.id)
        if not self.tools.owns(key) and not self.streams.follows(key):
            # A step of a tool loop another socket drives (or drove) is read for its calls from its start.
            if await self.followed.watch(generation, after_seq=after_seq):
                after_seq = 0
        await self._follow(generation, after_seq=after_seq)

    # --- following a stream (the protocol: inference/streaming/following.py) --------------------

    def _stream_follower(self) -> StreamFollower:
        return StreamFollower(layer=self.channel_layer, channel=self.channel_name, deliver=self._pass_on)

    async def _follow(self, generation: Generation, *, after_seq: int, fresh: bool = False) -> None:
        """Join the stream, then replay what was missed (`StreamFollower.follow`). The stream's row,
        when it must be read, is read as this user's: a stream is followed only by its owner."""
        key = str(generation.id)
        await self.streams.follow(key, after_seq=after_seq, fresh=fresh, read_row=lambda: self._own_generation(key))

    async def _follow_step(self, generation: Generation) -> None:
        """Follow the next step of an answer's tool loop, queued by this socket."""
        self._started.add(str(generation.id))
        await self._drives(str(generation.id))
        await self._follow(generation, after_seq=0, fresh=True)

    async def _forward(self, event: dict[str, Any]) -> None:
        await self.streams.forward(event)

    async def _pass_on(self, event: dict[str, Any]) -> None:
        if self.tools.owns(event.get("generation", "")):
            passed = await self.tools.passed_on(event)
            if passed is None:  # a step that ended in tool calls: they run now
                self._started.discard(event["generation"])
                return
            event = passed
        elif self.followed.has(event.get("generation", "")):
            for frame in await self.followed.passed_on(event):
                await self._send_event(frame)
            return
        await self._send_event(event)

    async def _send_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "generation.done":
            event = {**event, **await self._costs(event["generation"])}
        await self.send_json(event)
        if event["type"] in TERMINAL_EVENTS:
            self._started.discard(event["generation"])

    async def _costs(self, generation_id: str) -> dict[str, Any]:
        """The answer's cost, its conversation's total and the quota left (conversations.costs), for
        its `done`; nothing when they cannot be read: the answer's end matters more than its price."""
        try:
            return await db_async(generation_done_costs)(user=self.user, generation_id=generation_id)
        except Exception:  # a database away, or a bug: logged, and the answer still ends on screen
            logger.warning("generation %s: its cost could not be read for its done", generation_id, exc_info=True)
            return {}

    async def _resync_quiet_streams(self) -> None:
        """Every INFERENCE_STREAM_RESYNC_S, look at the streams that have been quiet that long
        (`StreamFollower.resync_quiet`): an answer whose end was lost live ends on screen."""
        interval = settings.INFERENCE_STREAM_RESYNC_S
        while True:
            await asyncio.sleep(interval)
            await self.streams.resync_quiet(quiet_s=interval)

    # --- channel-layer events -------------------------------------------------------------------

    async def generation_delta(self, event: dict[str, Any]) -> None:
        await self._forward(event)

    async def generation_done(self, event: dict[str, Any]) -> None:
        await self._forward(event)

    async def generation_error(self, event: dict[str, Any]) -> None:
        await self._forward(event)

    async def engine_status(self, event: dict[str, Any]) -> None:
        if not self._closed_for_access:
            await self.send_json(event)

    async def conversation_message(self, event: dict[str, Any]) -> None:
        """A message another of the user's sockets sent (`_others_tell`); the sender's own is not echoed."""
        if self._closed_for_access or event.get("origin") == self.channel_name:
            return
        await self.send_json({key: value for key, value in event.items() if key != "origin"})

    async def tool_relay(self, event: dict[str, Any]) -> None:
        """A frame of a tool loop another of the user's sockets drives (`_tool_send`)."""
        if self._closed_for_access or event.get("origin") == self.channel_name:
            return
        for frame in await self.followed.relayed(event["frame"]):
            await self.send_json(frame)

    async def conversation_title(self, event: dict[str, Any]) -> None:
        """A conversation of the user's has a title (written by the model, or renamed in another tab)."""
        if not self._closed_for_access:
            await self.send_json(event)

    async def conversation_summary(self, event: dict[str, Any]) -> None:
        """A conversation of the user's has a new summary of its earlier messages (orchestration)."""
        if not self._closed_for_access:
            await self.send_json(event)

    async def user_access(self, event: dict[str, Any]) -> None:
        """The user's account or sessions changed (accounts.services.user_access_changed)."""
        if self._closed_for_access:
            return
        if event.get("session") is not None:
            if event["session"] == self._session_digest:
                await self._close_for_access(CLOSE_SESSION_ENDED)
            return
        await self._access_holds(fresh=True)

    # --- access ---------------------------------------------------------------------------------

    async def _access_holds(self, *, fresh: bool = False) -> bool:
        """Whether the user may still use this socket; closes it when not. Read from the database
        unless a check passed within ACCESS_RECHECK_S (and `fresh` is not asked for)."""
        now = time.monotonic()
        if not fresh and now - self._access_checked_at < ACCESS_RECHECK_S:
            return True
        access = await _reconnecting(session_access)(
            user_id=self.user.id, session_key=self._session_key, session_auth_hash=self._session_hash
        )
        if access is SessionAccess.ALLOWED:
            self._access_checked_at = now
            return True
        await self._close_for_access(CLOSE_CODES[access])
        return False

    async def _close_for_access(self, code: int) -> None:
        """Close the socket for good and stop the answers it asked for that are still running."""
        self._closed_for_access = True
        await self.streams.close()  # first: nothing more is passed on from here
        await self.close(code=code)
        if self._resync is not None:
            self._resync.cancel()
        for generation_id in sorted(self._started):
            try:
                generation = await db_async(generation_get_for_user)(generation_id=generation_id, user=self.user)
                if generation is not None:
                    await self._stop(generation)
            except Exception:  # the rest are stopped all the same
                logger.exception("stopping generation %s of a closed socket failed", generation_id)

    # --- the user's open sockets -----------------------------------------------------------------

    async def _place_keep(self) -> None:
        """Renew this socket's place among its user's open sockets before it lapses. A place lost
        all the same (the process stood still past its lifetime, and others took it) closes it."""
        while True:
            await asyncio.sleep(settings.CHAT_SOCKET_PLACE_TTL_S / 3)
            try:
                kept = await socket_place_take(user_id=self.user.id, socket_id=self._place or "")
            except Exception:  # Redis away for a moment: the place lasts a TTL, try again next time
                logger.exception("renewing the socket place of user %s failed", self.user.id)
                continue
            if not kept:
                self._place = None
                await self._close_too_many()
                return

    async def _close_too_many(self) -> None:
        cap = settings.CHAT_SOCKETS_PER_USER
        await self.close(code=CLOSE_TOO_MANY_SOCKETS, reason=f"Too many open chat tabs (at most {cap}).")

    async def _place_give_back(self) -> None:
        """Free this socket's place, once; the renewal stops."""
        place, self._place = self._place, None
        if self._place_kept is not None:
            self._place_kept.cancel()
        if place is None:
            return
        try:
            await socket_place_give_back(user_id=self.user.id, socket_id=place)
        except Exception:  # it lapses at its expiry instead
            logger.exception("giving back the socket place of user %s failed", self.user.id)

    # --- helpers --------------------------------------------------------------------------------

    async def _own_generation(self, generation_id: Any) -> Generation:
        generation = None
        if isinstance(generation_id, str) and _is_uuid(generation_id):
            generation = await _reconnecting(generation_get_for_user)(generation_id=generation_id, user=self.user)
        if generation is None:
            raise ClientError("That answer does not exist.", code="not_found", status=404)
        return generation

    async def _error(self, code: str, message: str, *, retry_after: int | None = None, client_id: Any = None) -> None:
        payload: dict[str, Any] = {"type": "error", "code": code, "message": message}
        if retry_after is not None:
            payload["retry_after"] = retry_after
        if client_id is not None:
            payload["client_id"] = client_id
        await self.send_json(payload)


def _reconnecting(fn: Any) -> Any:
    """`fn` from the socket's loop, repeated on a fresh connection if its connection fails: only
    for calls that are safe to repeat."""
    return db_async(reconnecting(fn))


def _reconnecting_send(request: SendRequest) -> DatabaseCall:
    """A send's calls, repeated on a fresh connection. The send's repeat is a retry: its first try
    may have committed before its reply was lost, and a retry looks its client_id up first, where a
    first send would find the conversation busy with its own answer."""

    def call(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
        sending = fn is message_send
        if sending:
            return db_async(reconnecting(fn, request=replace(request, retry=True)))
        return _reconnecting(fn)

    return call


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
