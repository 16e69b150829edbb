"""The generation runner: the one code path from a queued Generation to a finished one.

It runs on the event loop that hosts the engine (the web server's in the embedded default, a worker's
engine thread under Celery). For each generation it claims the row, streams the engine's deltas to
the channel layer through a coalescing publisher, and records the end exactly once. A generation's
first dispatch carries its order (what the engine needs): the engine request starts at once and the
claim runs beside the engine's first step instead of before it, and nothing is shown or recorded
unless the claim succeeds. Stop cancels the task that consumes the engine's stream, and vLLM aborts
a request whose consumer is cancelled, so the engine stops spending time on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from contextlib import aclosing
from typing import Any

from django.conf import settings

import chatsite.request_context as request_context
from chatsite.database import db_async, reconnecting
from inference.engine.host import EngineRequestError, EngineUnavailable, engine_host_for
from inference.execution.replay import replay_stream
from inference.held import AnswerWithdrawn, HeldGates, held_verdict_wait
from inference.models import Generation
from inference.selectors import deployment_cached, deployment_get_cached, engine_spec_for
from inference.services import (
    generation_claim,
    generation_finish,
    generation_from_order,
    generation_images,
    generation_mark_started,
)
from inference.signals import generation_first_token
from inference.streaming.streams import StreamPublisher, usage
from moderation.services import CONTENT_FILTER, ContentFiltered, output_flag_create, output_monitor_for

logger = logging.getLogger(__name__)


# How long a stop that came before its stream began is kept for it (see Runner.abort).
EARLY_STOP_KEPT_S = 30.0


class NotClaimed(Exception):
    """Another run claimed the generation first, or it ended (stopped, withdrawn) before the claim."""


class Runner:
    def __init__(self, *, worker_name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.worker_name = worker_name
        self.loop = loop
        self._streams: dict[str, asyncio.Task] = {}
        # Generations this runner is running, from the task's arrival to its end (see `run`).
        self._runs: set[str] = set()
        # Stops that came before their stream began (generation id -> when): see `abort`.
        self._early_stops: dict[str, float] = {}
        # Held answers' gates, set when their message's verdict lets them through (inference.held).
        self.held = HeldGates()

    @property
    def active(self) -> int:
        return len(self._streams)

    def running_ids(self) -> list[str]:
        """The generations this runner is running, from before their claim until their end is
        recorded: a `running` row of this worker's that is not among them has no runner (the reaper
        ends it, `inference.execution.workers.reap_once`)."""
        return list(self._runs)

    def streaming_ids(self) -> list[str]:
        """The generations whose engine streams this runner is reading now."""
        return list(self._streams)

    def submit_threadsafe(
        self, generation_id: Any, *, order: dict[str, Any] | None = None
    ) -> concurrent.futures.Future:
        """Schedule a generation from any thread; the returned future ends when the generation does.

        The task starts in a context holding only the request's id and channel: the caller is usually
        a sync ORM thread inside asgiref, whose context marks its single thread as busy, and a task
        inheriting that would fail its first database call with "would deadlock".
        """
        future = request_context.carried().run(
            asyncio.run_coroutine_threadsafe, self.run(generation_id, order=order), self.loop
        )
        future.add_done_callback(_log_failure)
        return future

    def abort_threadsafe(self, generation_id: Any) -> None:
        self.loop.call_soon_threadsafe(self.abort, str(generation_id))

    def release_threadsafe(self, generation_id: Any) -> None:
        self.loop.call_soon_threadsafe(self.release, str(generation_id))

    def release(self, generation_id: str) -> bool:
        """Show a held answer's text from now on; True when this runner was holding it."""
        return self.held.release(generation_id)

    def abort(self, generation_id: str) -> bool:
        """Stop a generation's stream; True when this runner had it streaming.

        A stop can arrive after the claim has committed but before the stream has begun (the claim
        read no stop request, and the stop found the row running): it is kept a while, and the
        stream is stopped as it begins. Every worker hears every stop, so most are not its own.
        """
        key = str(generation_id)
        task = self._streams.get(key)
        if task is None:
            _remember(self._early_stops, key)
            return False
        if task.done():
            return False
        task.cancel()
        return True

    async def run(self, generation_id: Any, *, order: dict[str, Any] | None = None) -> None:
        """Run a generation if this runner's claim on it succeeds.

        Without an order (a re-dispatch, a restart's recovery) the row is claimed first and read from
        the claim. With one (`generation_order`, the first dispatch's), the engine request starts at
        once and the claim, a database round trip, runs beside the engine's first step. The claim
        alone still decides: nothing is shown before it succeeds, and when it fails (another delivery
        claimed it, or it was stopped or withdrawn meanwhile) the engine request is aborted at once
        and nothing is recorded. A second delivery to a runner already running the generation is
        dropped before it claims or touches the engine (the engine knows a request by its
        generation's id)."""
        key = str(generation_id)
        if key in self._runs:
            logger.info("generation %s is already running here; skipping", key)
            return
        self._runs.add(key)
        try:
            claim = asyncio.ensure_future(
                # Retried on a fresh connection: a claim lost to a dropped connection would leave
                # the answer queued, or running here with nobody to end it.
                db_async(reconnecting(generation_claim, again=True))(
                    generation_id=generation_id, worker=self.worker_name
                )
            )
            if order is None:
                generation = await claim
                if generation is None:
                    logger.info("generation %s was already claimed or ended; skipping", key)
                    return
            else:
                generation = generation_from_order(generation_id=generation_id, order=order)
                deployment_id = generation.deployment_id
                generation.deployment = deployment_cached(deployment_id=deployment_id) or await db_async(
                    deployment_get_cached
                )(deployment_id=deployment_id)
            await self._run_with_claim(generation, claim, tier_id=order.get("tier_id") if order else None)
        finally:
            self._runs.discard(key)

    async def _run_with_claim(self, generation: Generation, claim: asyncio.Future, *, tier_id: int | None) -> None:
        """Stream `generation`, which `claim` (a future of the claimed row, or None) decides is ours,
        then record and announce its end; its answer is moderated under `tier_id`'s policy (the
        order's), else its user's tier's."""
        key = str(generation.id)
        # Held for its message's verdict, unless the release came while the task was on its way.
        run = GenerationRun(generation, claim, gate=self.held.hold(generation), tier_id=tier_id)
        stream = asyncio.create_task(run.stream(), name=f"generation-{key}")
        self._streams[key] = stream
        if self._early_stops.pop(key, None) is not None:
            stream.cancel()
        claim.add_done_callback(functools.partial(run.on_claim, stream))
        try:
            status, error_code, error_message = await run.ending(stream)
        finally:
            self._streams.pop(key, None)
            self.held.forget(key)

        if await asyncio.shield(claim) is None:  # a claim that failed with an error raises here
            logger.info("generation %s was already claimed or ended; its engine request was dropped", key)
            return
        await asyncio.shield(
            self._finish(
                run.publisher,
                generation,
                status,
                run.progress,
                error_code,
                error_message,
                filtered=run.filtered,
                withdrawn=not run.released,
            )
        )

    async def _finish(
        self, publisher, generation, status, progress, error_code, error_message, *, filtered=None, withdrawn=False
    ) -> None:
        """Record the end, then announce it, so whoever hears `done` finds the row final. `withdrawn`:
        a held answer that ended before its verdict let it through (most often, the verdict blocked
        it and took its row away)."""
        # A cut answer keeps only the text that passed moderation, and the client is told to show that.
        text = filtered.shown_text if filtered is not None else publisher.text
        # Retried on a fresh connection: an end that is not recorded leaves the conversation
        # answering for ever (until the reaper finds this runner no longer runs it), unsaved, uncharged.
        finished = await db_async(reconnecting(generation_finish, again=True))(
            generation_id=generation.id,
            status=status,
            text=text,
            finish_reason=progress["finish_reason"],
            prompt_tokens=progress["prompt_tokens"],
            completion_tokens=progress["completion_tokens"],
            cached_tokens=progress["cached_tokens"],
            error_code=error_code,
            error_message=error_message,
        )
        if finished is None:
            if withdrawn:
                logger.info("generation %s was withdrawn: its message did not pass input moderation", generation.id)
            else:
                logger.warning("generation %s had already been ended elsewhere", generation.id)
            return
        if filtered is not None:
            await db_async(output_flag_create)(
                generation_id=generation.id, user_id=generation.user_id, filtered=filtered
            )
        if status == Generation.Status.FAILED:
            await publisher.fail(code=error_code, message=error_message)
        else:
            await publisher.finish(
                status=status,
                finish_reason=progress["finish_reason"],
                usage=usage(progress["prompt_tokens"], progress["completion_tokens"], progress["cached_tokens"]),
                text=text if filtered is not None else None,
            )


class GenerationRun:
    """One generation's pass through the engine on a runner: its engine stream, the claim that
    decides whether anything of it is shown, the verdict a held answer waits for, output moderation,
    and what its end was.

    The engine request starts before the claim is known (`Runner.run`): `stream` reads the engine's
    deltas, and at the first one waits for the claim (nothing is shown before it), then for a held
    answer's verdict, then for the output-moderation policy read meanwhile. `on_claim` cancels the
    stream as soon as the claim fails. `ending` turns the way the stream ended into the status the
    row is finished with.
    """

    def __init__(
        self,
        generation: Generation,
        claim: asyncio.Future,
        *,
        gate: asyncio.Event | None,
        tier_id: int | None,
    ) -> None:
        self.generation = generation
        self.claim = claim
        # An answer from the response cache is played back (inference.caching): no engine runs it.
        self._host = None if generation.cached else engine_host_for(engine_spec_for(generation.deployment))
        self.gate = gate
        self.publisher = StreamPublisher(generation.id)
        self.progress: dict[str, Any] = {
            "prompt_tokens": len(generation.prompt_token_ids),
            "completion_tokens": 0,
            "cached_tokens": 0,
            "finish_reason": "",
        }
        self.filtered: ContentFiltered | None = None
        self.released = gate is None  # whether the text may be shown: a held answer's, once its verdict passes
        # Output moderation: scores each completed sentence; raises ContentFiltered to cut the answer.
        # Its policy is read while the engine works on the first token, not before the request starts;
        # a read, retried on a fresh connection: one the database dropped would fail the answer.
        self._monitor_loading = asyncio.ensure_future(
            db_async(reconnecting(output_monitor_for))(generation=generation, tier_id=tier_id)
        )
        # An answer that ends before its first token (a stop, an engine error) never awaits it.
        self._monitor_loading.add_done_callback(lambda future: future.cancelled() or future.exception())

    async def stream(self) -> None:
        """Read the engine's deltas into the publisher, each checked by output moderation."""
        generation = self.generation
        # aclosing: leaving the loop early (a content-filter cut) closes the stream, which aborts
        # the request inside vLLM just as a cancelled consumer does.
        source = (
            replay_stream(
                text=generation.text,
                prompt_tokens=len(generation.prompt_token_ids),
                completion_tokens=generation.completion_tokens,
            )
            if self._host is None
            else self._host.stream(
                request_id=str(generation.id),
                prompt_token_ids=generation.prompt_token_ids,
                sampling=generation.sampling,
                priority=generation.priority,
                images=await db_async(generation_images)(generation_id=generation.id) if generation.image_count else (),
            )
        )
        try:
            async with aclosing(source) as deltas:
                monitor = None
                async for delta in deltas:
                    if monitor is None:
                        monitor = await self._first_text_may_show()
                    # As the engine counts them: a vision model's images expand into tokens of their own.
                    self.progress["prompt_tokens"] = max(self.progress["prompt_tokens"], delta.prompt_tokens)
                    self.progress["completion_tokens"] = delta.completion_tokens
                    self.progress["cached_tokens"] = max(self.progress["cached_tokens"], delta.cached_tokens)
                    await monitor.feed(delta.text, final=delta.finished)
                    await self.publisher.add_text(delta.text, logprobs=delta.logprobs)
                    if delta.finished:
                        self.progress["finish_reason"] = delta.finish_reason or "stop"
                        # The last words go out once they have passed their check, not after the
                        # end is recorded: only `done` waits for the row (Runner._finish).
                        await self.publisher.flush()
        finally:
            # No timed send of text once the engine's stream has ended: what is left goes with the end.
            self.publisher.stream_ended()

    async def _first_text_may_show(self) -> Any:
        """Wait, at the first delta, for what must come before any text is shown: the claim, a held
        answer's verdict, and the output monitor. Returns the monitor."""
        row = await self._claimed()
        if not self.released:
            assert self.gate is not None
            await held_verdict_wait(self.generation, self.gate)
            self.released = True
            _mark_started(row)
        monitor = await self._monitor_loading
        generation_first_token.send(Runner, generation=self.generation)
        return monitor

    async def _claimed(self) -> Generation:
        row = await asyncio.shield(self.claim)
        if row is None:
            raise NotClaimed
        return row

    def on_claim(self, stream: asyncio.Task, future: asyncio.Future) -> None:
        """When the claim is known: a failed one cancels the stream, out of the engine now rather
        than at its first token; a successful one marks the message streaming (a held one's only
        once released), or opens a gate whose release was missed on the way."""
        row = None if future.cancelled() or future.exception() is not None else future.result()
        if row is None:
            stream.cancel()
            return
        if self.gate is not None and not row.awaiting_verdict:
            self.gate.set()  # released while the task was on its way, and its release missed
        elif self.gate is None:
            # The message shows as streaming once the engine request is under way and claimed.
            _mark_started(row)

    async def ending(self, stream: asyncio.Task) -> tuple[str, str, str]:
        """Wait for the stream to end (within INFERENCE_GENERATION_TIMEOUT_S) and say how it ended:
        (status, error code, error message). A content-filter cut is kept in `filtered`."""
        try:
            async with asyncio.timeout(settings.INFERENCE_GENERATION_TIMEOUT_S):
                await stream
        except TimeoutError:
            return Generation.Status.FAILED, "timeout", "The answer took too long and was stopped."
        except asyncio.CancelledError:
            self.progress["finish_reason"] = "abort"
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # The runner itself is being torn down (process shutdown), not a user's stop.
                return Generation.Status.FAILED, "interrupted", "The server stopped mid-answer."
            return Generation.Status.STOPPED, "", ""
        except (AnswerWithdrawn, NotClaimed):
            self.progress["finish_reason"] = "abort"
            return Generation.Status.STOPPED, "", ""
        except ContentFiltered as exc:
            self.filtered = exc
            self.progress["finish_reason"] = CONTENT_FILTER
            return Generation.Status.STOPPED, "", ""
        except EngineUnavailable as exc:
            return Generation.Status.FAILED, "model_unavailable", str(exc)
        except EngineRequestError as exc:
            return Generation.Status.FAILED, "engine_error", str(exc)
        except Exception as exc:  # anything else must still end the message, never leave it pending
            logger.exception("generation %s failed", self.generation.id)
            return Generation.Status.FAILED, "internal_error", type(exc).__name__
        return Generation.Status.COMPLETE, "", ""


def _mark_started(claimed: Generation) -> None:
    """Show the message as streaming, off the path to the first token."""
    marking = asyncio.ensure_future(db_async(generation_mark_started)(generation=claimed))
    marking.add_done_callback(_log_failure)


def _remember(early: dict[str, float], key: str) -> None:
    """Note a stop for a stream not begun yet, forgetting those kept long enough."""
    now = time.monotonic()
    for old_key in [k for k, t in early.items() if now - t >= EARLY_STOP_KEPT_S]:
        del early[old_key]
    early[key] = now


def _log_failure(future: concurrent.futures.Future | asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.error("generation runner crashed", exc_info=future.exception())
