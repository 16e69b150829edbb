"""The chat socket's side of the tool loop: it follows each step of an answer that may call tools,
runs the calls between the steps, asks the person about calls with side effects, and queues the
next step (the rules: orchestration.tools.loop; the rows: conversations.services.tool_steps).

What the page hears, beside the steps' own streams (`generation.delta` carries only a step's words,
never the text of its calls):
- `tool.calls` {generation, assistant_message, content, calls: [{id, name, arguments}]}: a step ended in calls;
- `tool.approval` {generation, call: {id, name, arguments}}: nothing runs until the person answers
  with `tool.approve` {generation, call, decision: "once" | "chat" | "deny"};
- `tool.running` {generation, call}, then `tool.result` {generation, message, call, name, outcome,
  output, truncated, details}: one call ran (or did not: `outcome` says why);
- `tool.step` {previous, assistant_message {id, parent}, generation, model, step, note?}: the next step is
  queued and followed, as a send's answer is;
- `tool.stopped` {generation}: Stop ended the answer between its steps.
The answer in words ends with its step's `generation.done`, as any answer does.

The user's other sockets hear the same frames, marked `elsewhere` (`FollowedSteps`, below), and
`tool.ended` {generation, note} for a step whose loop ended with the socket that drove it.
A REST send's event stream drives its answer's loop with the same class (conversations.tool_streams).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.cache import cache

from accounts.models import User
from chatsite.database import db_async
from conversations.models import Message
from conversations.services.tool_steps import (
    tool_allowed_for_chat,
    tool_calls_record,
    tool_loop_stopped,
    tool_result_save,
    tool_step_queue,
    tools_allowed_for_chat,
)
from inference.models import Generation, ModelDeployment
from inference.openai.tools import ToolCallReader, tool_call_reader_for, tool_call_readers
from inference.selectors import generation_writer
from orchestration.tools.base import Tool, ToolContext
from orchestration.tools.loop import (
    LIMIT_CALLS,
    LIMIT_NOTE,
    REFUSED,
    CallResult,
    LoopLimits,
    Outcome,
    ToolCall,
    ToolPlan,
    call_result_plain,
    calls_within_limit,
    tool_call_run,
)
from orchestration.tools.registry import tools_offered

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Follow = Callable[[Generation], Awaitable[None]]
DECISIONS = ("once", "chat", "deny")
STOPPED = "Stopped by the user before the tool answered."


@dataclass
class AnswerLoop:
    """One answer's loop, as far as it has gone."""

    conversation_id: int
    project_id: int | None
    user_message_id: int
    tier_id: int | None
    deployment: ModelDeployment
    plan: ToolPlan
    generation_id: str
    answer_id: int
    step: int = 1
    calls_used: int = 0
    reader: ToolCallReader | None = None
    task: asyncio.Task[None] | None = None
    waiting: dict[str, asyncio.Future[str]] = field(default_factory=dict)
    tools: dict[str, Tool] = field(default_factory=dict)


class ToolLoops:
    """The loops of the answers one socket asked for, by their current step's generation."""

    def __init__(self, *, user: User, send: Send, follow: Follow) -> None:
        self.user = user
        self._send = send
        self._follow = follow
        self._loops: dict[str, AnswerLoop] = {}
        self.limits = LoopLimits.from_settings()

    async def start(
        self,
        *,
        plan: ToolPlan,
        generation: Generation,
        answer_id: int,
        user_message_id: int,
        conversation_id: int,
        project_id: int | None,
    ) -> None:
        """Follow the first step of an answer that may call tools (call before following its stream)."""
        deployment = generation.deployment
        loop = AnswerLoop(
            conversation_id=conversation_id,
            project_id=project_id,
            user_message_id=user_message_id,
            tier_id=plan.tier_id,
            deployment=deployment,
            plan=plan,
            generation_id=str(generation.id),
            answer_id=answer_id,
        )
        loop.reader = await self._reader(loop)
        self._loops[loop.generation_id] = loop

    def owns(self, generation_id: str) -> bool:
        return generation_id in self._loops

    async def passed_on(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """What of a step's event goes to the page: a delta's words only; a step that ended in calls
        says so itself (`tool.calls`) and runs them, instead of its `generation.done`."""
        loop = self._loops.get(event.get("generation", ""))
        if loop is None:
            return event
        if loop.task is not None:  # its calls are running: a replay of its end (a resync) says nothing new
            return None
        if event["type"] == "generation.delta" and loop.reader is not None:
            content, _ = loop.reader.delta(event.get("text") or "")
            return {**event, "text": content} if content else None
        if event["type"] == "generation.done" and event.get("status") == "complete":
            text = await db_async(_generation_text)(generation_id=loop.generation_id)
            content, calls = loop.reader.complete(text) if loop.reader is not None else (text, [])
            if calls:
                loop.task = asyncio.ensure_future(self._step(loop, content or "", [ToolCall.of(c) for c in calls]))
                return None
        if event["type"] in ("generation.done", "generation.error"):
            self._loops.pop(loop.generation_id, None)
        return event

    async def approve(self, content: dict[str, Any]) -> None:
        """A `tool.approve` frame: the person's answer to a call waiting for it."""
        if not self.answer(
            generation_id=content.get("generation"), call_id=content.get("call"), decision=content.get("decision")
        ):
            await self._send(
                {"type": "error", "code": "invalid_request", "message": "No call is waiting for that answer."}
            )

    def answer(self, *, generation_id: Any, call_id: Any, decision: Any) -> bool:
        """The person's answer to a call waiting for it, however it came (a socket's frame, the REST
        API's approval through the channel layer); False when no such call waits or the decision is
        not one of DECISIONS."""
        loop = self._loops.get(str(generation_id))
        waiting = loop.waiting.get(str(call_id)) if loop is not None else None
        if waiting is None or decision not in DECISIONS:
            return False
        if not waiting.done():
            waiting.set_result(str(decision))
        return True

    async def stop(self, generation_id: str) -> bool:
        """Stop an answer that is between its steps (its tools running or waiting); False when the
        generation is not such a step, for the ordinary Stop to handle."""
        loop = self._loops.get(generation_id)
        if loop is None or loop.task is None or loop.task.done():
            return False
        loop.task.cancel()
        try:
            await loop.task
        except asyncio.CancelledError:
            pass
        return True

    def streaming(self) -> list[str]:
        """The steps still being written that may call tools: closing the socket leaves them to
        finish as answers, with no loop after them (a last step, offered none, is an answer anyway)."""
        return sorted(gid for gid, loop in self._loops.items() if loop.task is None and loop.reader is not None)

    async def close(self) -> None:
        for loop in list(self._loops.values()):
            if loop.task is not None and not loop.task.done():
                loop.task.cancel()
        self._loops.clear()

    # --- a step's calls ----------------------------------------------------------------------------

    async def _step(self, loop: AnswerLoop, content: str, calls: list[ToolCall]) -> None:
        gid = loop.generation_id
        parent = loop.answer_id
        try:
            await db_async(tool_calls_record)(user=self.user, answer_id=loop.answer_id, calls=calls, content=content)
            await self._send(
                {
                    "type": "tool.calls",
                    "generation": gid,
                    "assistant_message": loop.answer_id,
                    "content": content,
                    "calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
                }
            )
            if not loop.tools:
                loop.tools = await db_async(tools_offered)(deployment_id=loop.deployment.id, tier_id=loop.tier_id)
            runnable = calls_within_limit(calls, used=loop.calls_used, limits=self.limits)
            for index, call in enumerate(calls):
                if index >= runnable:
                    result = call_result_plain(
                        call=call, outcome=Outcome.NOT_RUN, text=LIMIT_CALLS.format(limit=self.limits.max_calls)
                    )
                else:
                    loop.calls_used += 1
                    result = await self._call(loop, call)
                parent = await self._result_saved(loop, parent, result)
            loop.step += 1
            tools_left = loop.step < self.limits.max_steps and loop.calls_used < self.limits.max_calls
            queued = await db_async(tool_step_queue)(
                user=self.user,
                conversation_id=loop.conversation_id,
                user_message_id=loop.user_message_id,
                parent_id=parent,
                plan=loop.plan,
                step=loop.step,
                tools_left=tools_left,
            )
        except asyncio.CancelledError:
            await asyncio.shield(self._stopped(loop))
            raise
        except Exception as exc:
            logger.exception("the tool loop of generation %s failed", gid)
            self._loops.pop(gid, None)
            message = getattr(exc, "message", None) or "The answer's next step could not start."
            await self._send(
                {
                    "type": "generation.error",
                    "generation": gid,
                    "code": getattr(exc, "code", "tool_loop_failed"),
                    "message": message,
                }
            )
            return
        self._loops.pop(gid, None)
        loop.generation_id, loop.answer_id, loop.task = str(queued.generation.id), queued.answer.id, None
        loop.reader = await self._reader(loop) if tools_left else None
        self._loops[loop.generation_id] = loop
        frame: dict[str, Any] = {
            "type": "tool.step",
            "previous": gid,
            "assistant_message": {"id": queued.answer.id, "parent": parent},
            "generation": loop.generation_id,
            "model": generation_writer(queued.generation),
            "step": loop.step,
        }
        if not tools_left:
            frame["note"] = (
                LIMIT_NOTE.format(limit=self.limits.max_steps)
                if loop.step >= self.limits.max_steps
                else LIMIT_CALLS.format(limit=self.limits.max_calls)
            )
        await self._send(frame)
        await self._follow(queued.generation)

    async def _call(self, loop: AnswerLoop, call: ToolCall) -> CallResult:
        shown = {"id": call.id, "name": call.name, "arguments": call.arguments}
        if call.name in loop.plan.approval:
            allowed = await db_async(tools_allowed_for_chat)(user=self.user, conversation_id=loop.conversation_id)
            if call.name not in allowed:
                decision = await self._ask(loop, call, shown)
                if decision == "deny":
                    return call_result_plain(call=call, outcome=Outcome.REFUSED, text=REFUSED)
                if decision == "chat":
                    await db_async(tool_allowed_for_chat)(
                        user=self.user, conversation_id=loop.conversation_id, tool=call.name
                    )
        await self._send({"type": "tool.running", "generation": loop.generation_id, "call": shown})
        context = ToolContext(
            user_id=self.user.id,
            conversation_id=loop.conversation_id,
            timeout_s=self.limits.timeout_s,
            max_output_chars=self.limits.max_output_chars,
            project_id=loop.project_id,
        )
        return await tool_call_run(call=call, tools=loop.tools, context=context, user_id=self.user.id)

    async def _ask(self, loop: AnswerLoop, call: ToolCall, shown: dict[str, Any]) -> str:
        """The person's answer to a call with side effects; no answer in time counts as a refusal."""
        waiting: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        loop.waiting[call.id] = waiting
        try:
            await self._send({"type": "tool.approval", "generation": loop.generation_id, "call": shown})
            return await asyncio.wait_for(waiting, timeout=self.limits.approval_timeout_s)
        except TimeoutError:
            return "deny"
        finally:
            loop.waiting.pop(call.id, None)

    async def _result_saved(self, loop: AnswerLoop, parent: int, result: CallResult) -> int:
        message = await db_async(tool_result_save)(
            user=self.user, conversation_id=loop.conversation_id, parent_id=parent, result=result
        )
        await self._send(
            {
                "type": "tool.result",
                "generation": loop.generation_id,
                "message": message.id,
                "call": result.call.id,
                "name": result.call.name,
                "outcome": result.outcome.value,
                "output": result.shown,
                "truncated": result.truncated,
                "details": message.tool_shown.get("details", {}),
            }
        )
        return message.id

    async def _stopped(self, loop: AnswerLoop) -> None:
        self._loops.pop(loop.generation_id, None)
        try:
            await db_async(tool_loop_stopped)(user=self.user, answer_id=loop.answer_id)
            await self._send({"type": "tool.stopped", "generation": loop.generation_id})
        except Exception:
            logger.exception("marking the stopped tool loop of generation %s failed", loop.generation_id)

    async def _reader(self, loop: AnswerLoop) -> ToolCallReader | None:
        request = loop.plan.request(model=loop.deployment.name, step=loop.step, limits=self.limits)
        readers = await asyncio.to_thread(tool_call_readers, request, deployment=loop.deployment, n=1)
        return readers[0] if readers else None


def _generation_text(*, generation_id: str) -> str:
    return Generation.objects.filter(id=generation_id).values_list("text", flat=True).first() or ""


def _answer_of(*, generation_id: str) -> int | None:
    return Message.objects.filter(generation_id=generation_id).values_list("id", flat=True).first()


# --- the loop seen from the user's other sockets -------------------------------------------------------

# What another page shows under an answer whose loop ended with the socket that drove it.
LOOP_ENDED = "This answer's tools stopped here: the tab that asked for them was closed or lost its connection."


# How long a step may wait in the queue: beyond it, a mark a dead process left behind lapses.
QUEUE_SLACK_S = 3600


def _driven_key(generation_id: str) -> str:
    return f"tools:driven:{generation_id}"


def _driven_ttl_s() -> float:
    """A step's longest life: queued, written, and its calls run (each asked about and timed out)."""
    per_call = settings.TOOLS_TIMEOUT_S + settings.TOOLS_APPROVAL_TIMEOUT_S
    return QUEUE_SLACK_S + settings.INFERENCE_GENERATION_TIMEOUT_S + settings.TOOLS_MAX_CALLS * per_call


async def tool_steps_driven(*, generation_ids: list[str], driven: bool) -> None:
    """Mark the steps a socket drives (or no longer does, once it closes), for the other sockets that
    follow them to tell a step whose calls will run from one whose loop has ended. A mark a process
    that died could not clear lapses after a step's longest life (`_driven_ttl_s`)."""
    keys = [_driven_key(g) for g in generation_ids]
    if not keys:
        return
    try:
        if driven:
            await asyncio.to_thread(cache.set_many, dict.fromkeys(keys, 1), timeout=_driven_ttl_s())
        else:
            await asyncio.to_thread(cache.delete_many, keys)
    except Exception:  # the loop runs all the same; the other pages may then wait for a reload
        logger.exception("marking the tool steps %s failed", ", ".join(generation_ids))


async def tool_step_is_driven(generation_id: str) -> bool:
    try:
        return bool(await asyncio.to_thread(cache.get, _driven_key(generation_id)))
    except Exception:
        logger.exception("reading the mark of tool step %s failed", generation_id)
        return False


@dataclass
class FollowedStep:
    """A tool-loop step a socket follows but does not drive, as far as its page has seen it."""

    generation_id: str
    reader: ToolCallReader
    shown_upto: int  # the page has the step's words up to this seq: deltas to it only feed the reader
    calls: list[dict[str, Any]] | None = None  # at its end, when it called tools: the calls read from it
    content: str = ""
    told: bool = False  # the driving socket's `tool.calls` has been passed on
    ended: bool = False  # the driving socket has closed: no loop goes on after this step


class FollowedSteps:
    """The tool-loop steps one socket follows that another socket drives (another tab's answer), or
    that nobody drives any more (its own page's, after a reconnect: the loop ended with the socket).

    A step's stream is read with the deployment's tool parser, from the tool fields its generation
    kept, so the page gets only its words. At its end in calls, the driving socket's frames tell the
    page the rest (`relayed`); a step nobody drives shows its calls and ends there (`tool.ended`).
    Nothing runs here."""

    def __init__(self) -> None:
        self._steps: dict[str, FollowedStep] = {}

    def has(self, generation_id: str) -> bool:
        return generation_id in self._steps

    async def watch(self, generation: Generation, *, after_seq: int) -> bool:
        """Read `generation`'s stream from its start (the page has it up to `after_seq`) if it is a
        step read for calls; False when it is not, and its stream passes as it is."""
        if not generation.tool_fields:
            return False
        reader = await asyncio.to_thread(
            tool_call_reader_for, fields=generation.tool_fields, deployment=generation.deployment
        )
        if reader is None:
            return False
        gid = str(generation.id)
        self._steps[gid] = FollowedStep(generation_id=gid, reader=reader, shown_upto=after_seq)
        return True

    async def passed_on(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """What of a followed step's event goes to the page: a delta's words; at its end in calls, the
        calls when nobody drives it (and that its loop ended), else nothing until the driver says."""
        step = self._steps.get(event.get("generation", ""))
        if step is None:
            return [event]
        if event["type"] == "generation.delta":
            content, _ = step.reader.delta(event.get("text") or "")
            return [{**event, "text": content}] if content and event["seq"] > step.shown_upto else []
        if event["type"] != "generation.done":
            self._steps.pop(step.generation_id, None)
            return [event]
        text = event.get("text")
        if not isinstance(text, str):
            text = await db_async(_generation_text)(generation_id=step.generation_id)
        content, calls = step.reader.complete(text)
        if event.get("status") != "complete" or not calls:
            self._steps.pop(step.generation_id, None)
            return [{**event, "text": content or ""}] if "text" in event else [event]
        step.calls, step.content = calls, content or ""
        if step.told or (not step.ended and await tool_step_is_driven(step.generation_id)):
            return []  # the driving socket tells the rest (`relayed`)
        return await self._ended(step)

    async def relayed(self, frame: dict[str, Any]) -> list[dict[str, Any]]:
        """A frame of the loop another socket drives, for this page, marked `elsewhere`: a
        `tool.approval` there is shown as waiting for that tab, and answered only there."""
        gid = str(frame.get("generation", ""))
        step = self._steps.get(frame.get("previous", gid))
        if step is not None:
            if frame["type"] == "tool.calls":
                step.told = True
            elif frame["type"] == "tool.ended":
                step.ended = True
                if step.calls is None:
                    return []  # still being written: it ends here once its end is read
                return await self._ended(step)
            elif frame["type"] in ("tool.step", "tool.stopped", "generation.error"):
                self._steps.pop(step.generation_id, None)
        return [{**frame, "elsewhere": True}]

    async def _ended(self, step: FollowedStep) -> list[dict[str, Any]]:
        self._steps.pop(step.generation_id, None)
        frames: list[dict[str, Any]] = []
        if not step.told:
            frames.append(
                {
                    "type": "tool.calls",
                    "generation": step.generation_id,
                    "assistant_message": await db_async(_answer_of)(generation_id=step.generation_id),
                    "content": step.content,
                    "calls": [
                        {"id": c.id, "name": c.name, "arguments": c.arguments}
                        for c in (ToolCall.of(call) for call in step.calls or [])
                    ],
                }
            )
        frames.append({"type": "tool.ended", "generation": step.generation_id, "note": LOOP_ENDED})
        return frames
