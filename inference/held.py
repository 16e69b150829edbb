"""The held answer: computed by the engine while its message is still being scored, shown only once
input moderation lets the message through.

A service given an `InputCheck` whose scores are not in once its transaction has done everything
else commits its generations held (`Generation.awaiting_verdict`) and dispatches them, so the engine
starts while the message is scored. One protocol serves every caller (a chat message, an OpenAI
completion):

- The service returns what it did with its verdict `pending`: a `HeldAnswer` describing what it
  committed, which its owner subclasses to say what the verdict means for its own rows (`passed`,
  `withdrawn`, `blocked`).
- The caller settles it (`HeldAnswer.settle`): an async caller (`message_send_checked`,
  `completion_create_checked`) first awaits the scores on the event loop, holding no database
  thread, then settles in a database call of its own; a sync caller settles at once.
- A verdict that passes releases the generations (`generation_release`); one that blocks withdraws
  them (`generation_withdraw`: rows removed, engine requests aborted, the rate-limit charge given
  back), and the caller gets what it would have had the verdict come first.
- On the runner, a held generation's first text waits at a gate (`HeldGates`, `held_verdict_wait`)
  opened by its release: a call in the embedded default, the release channel on a worker, or the row
  found released. With no verdict within INFERENCE_VERDICT_WAIT_S the web process is taken for dead
  and the runner judges the message itself (`held_answer_judge`): the owner hands its `HeldAnswer`
  back through the hook it registered (`held_answer_owner_register`), and a generation no owner
  claims is withdrawn.

Release and withdrawal are conditional updates of `awaiting_verdict`: of two verdicts racing (the web
process's and a runner's last resort), one decides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from django.conf import settings
from django.db import transaction

from accounts.models import User
from accounts.services import Admission, admission_refund
from chatsite.completion import run_to_end
from chatsite.database import DatabaseCall, db_async, reconnecting
from inference.backend import generation_abort, generation_gate_open
from inference.models import Generation, GenerationId
from inference.selectors import generation_awaiting_verdict
from moderation.services import InputCheck, Verdict, input_moderate

logger = logging.getLogger(__name__)

Result = TypeVar("Result")
T = TypeVar("T")


class HeldAnswerRecover(Protocol):
    """What an app that holds answers (conversations, for a chat message) registers at start-up: the
    `HeldAnswer` a held generation writes for it, rebuilt from its rows, or None when it is not its own."""

    def __call__(self, *, generation_id: GenerationId) -> HeldAnswer[Any] | None: ...


_owners: list[HeldAnswerRecover] = []


def held_answer_owner_register(recover: HeldAnswerRecover) -> None:
    """Have `held_answer_judge` ask `recover` for the held answers of its app; once, at start-up."""
    if recover not in _owners:
        _owners.append(recover)


# How often a runner holding a generation's text looks for its release in the database, in case the
# release it was sent was lost on the way.
VERDICT_POLL_S = 0.5
# How often a repeated send looks whether its first send's held answer has been judged yet.
VERDICT_WAIT_POLL_S = 0.01
# How long a release that came before its stream began is kept for it.
EARLY_RELEASE_KEPT_S = 30.0


@dataclass(frozen=True)
class HeldAnswer(ABC, Generic[Result]):
    """Generations committed held, the verdict on `text` still to be taken, and what their owner
    makes of it. `Result` is what the owner's service returns."""

    user: User
    text: str  # what input moderation judges
    generations: Sequence[Generation]
    admissions: Sequence[Admission]  # given back when the answer is withdrawn
    tier_id: int | None  # whose policy the verdict is taken under

    @abstractmethod
    def passed(self, verdict: Verdict) -> Result:
        """What the service returns when the verdict lets the answer through (the generations are
        released right after)."""

    def withdrawn(self, verdict: Verdict | None) -> None:
        """The owner's rows, in the transaction that withdraws the generations: `verdict` blocked
        them, or (None) its scores never came and the work is undone as if never sent."""

    @abstractmethod
    def blocked(self, verdict: Verdict, *, withdrawn: bool) -> Result:
        """What the service returns, or raises, when the verdict blocks; `withdrawn` is False when
        another verdict decided first."""

    async def settled(self, call: DatabaseCall, check: InputCheck) -> Result:
        """`settle` from async code: the scores awaited on the event loop (no database thread waits
        for them; on SQLite the process's only one, which the answer's own claim needs), then the
        verdict taken and applied in a database call of its own, through `call`."""
        await check.scored()
        return await call(self.settle)(check)

    def settle(self, check: InputCheck) -> Result:
        """Take the verdict (waiting for its scores) and apply it. Scores that never come undo the
        work and refuse it, as they do when the verdict is taken inside the transaction."""
        try:
            verdict = check.verdict(tier_id=self.tier_id)
        except Exception:
            self._withdraw(None)
            self._refund()
            raise
        return self.apply(verdict)

    def apply(self, verdict: Verdict) -> Result:
        if not verdict.blocks:
            result = self.passed(verdict)
            for generation in self.generations:
                generation_release(generation_id=generation.id)
                generation.awaiting_verdict = False
            return result
        withdrawn = self._withdraw(verdict)
        if withdrawn:
            self._refund()
        return self.blocked(verdict, withdrawn=withdrawn)

    def _withdraw(self, verdict: Verdict | None) -> bool:
        with transaction.atomic():
            withdrawn = [generation_withdraw(generation_id=g.id) for g in self.generations]
            if any(withdrawn):
                self.withdrawn(verdict)
        return any(withdrawn)

    def _refund(self) -> None:
        for admission in self.admissions:
            admission_refund(admission=admission)


async def with_input_check(text: str, work: Callable[[InputCheck], Awaitable[T]]) -> T:
    """`work(check)` from async code, `check` being input moderation's check of `text`, its scoring
    begun only when first asked for (`InputCheck.deferred`). The check is discarded once the work
    ends, and the work runs to its end even if the caller is cancelled (a socket closed, a client
    gone), so what it committed is always released or withdrawn."""
    check = InputCheck.deferred(text)

    async def run() -> T:
        try:
            return await work(check)
        finally:
            check.discard()

    return await run_to_end(run())


def generation_release(*, generation_id: GenerationId) -> bool:
    """Let a held generation's text through: its runner shows it from now on. False when it was not
    held any more (released or withdrawn already)."""
    released = Generation.objects.filter(id=generation_id, awaiting_verdict=True).update(awaiting_verdict=False)
    if released:
        generation_gate_open(generation_id=generation_id)
    return bool(released)


def generation_withdraw(*, generation_id: GenerationId) -> bool:
    """Take back a held generation as if it had never been queued: the row goes (nothing of it was
    shown, nothing is charged), and once the caller's transaction commits its engine request is
    aborted. False when it was not held any more."""
    withdrawn, _ = Generation.objects.filter(id=generation_id, awaiting_verdict=True).delete()
    if withdrawn:
        transaction.on_commit(lambda: generation_abort(generation_id=generation_id))
    return bool(withdrawn)


def held_answer_judge(*, generation_id: GenerationId) -> None:
    """Judge a held generation's message here, as a runner's last resort when the web process that
    saved it never gave its verdict, so that no message goes into a prompt, or its answer onto a
    screen, unjudged. Its rate-limit charge stays taken. No owner: the generation is withdrawn."""
    recovered = [held for recover in _owners if (held := recover(generation_id=generation_id)) is not None]
    if not recovered:
        generation_withdraw(generation_id=generation_id)
    for held in recovered:
        held.apply(input_moderate(user=held.user, text=held.text))


def held_verdict_wait_sync(*, generation_id: GenerationId) -> None:
    """Wait, polling, until a held generation has been judged (or long enough that a runner judges
    it). For a send repeated while its first send is still judging it: milliseconds."""
    deadline = time.monotonic() + settings.INFERENCE_VERDICT_WAIT_S + 1
    while generation_awaiting_verdict(generation_id=generation_id) and time.monotonic() < deadline:
        time.sleep(VERDICT_WAIT_POLL_S)


class AnswerWithdrawn(Exception):
    """The held answer's message was blocked (or never judged): its row is gone, its text unshown."""


class HeldGates:
    """A runner's held generations: the gate each one's first text waits at, set by its release.

    A release can come before its stream has begun (the web process judged the message while the
    task was on its way): it is kept a while, and the stream begins released."""

    def __init__(self) -> None:
        self._gates: dict[str, asyncio.Event] = {}
        self._early: dict[str, float] = {}

    def hold(self, generation: Generation) -> asyncio.Event | None:
        """The gate `generation`'s first text waits at; None when it is not held (any more)."""
        key = str(generation.id)
        if not generation.awaiting_verdict or self._early.pop(key, None) is not None:
            return None
        gate = self._gates[key] = asyncio.Event()
        return gate

    def release(self, generation_id: GenerationId) -> bool:
        """Open the generation's gate; True when this runner was holding it."""
        key = str(generation_id)
        gate = self._gates.get(key)
        if gate is None:
            now = time.monotonic()
            for old in [k for k, t in self._early.items() if now - t >= EARLY_RELEASE_KEPT_S]:
                del self._early[old]
            self._early[key] = now
            return False
        gate.set()
        return True

    def forget(self, generation_id: GenerationId) -> None:
        self._gates.pop(str(generation_id), None)


async def held_verdict_wait(generation: Generation, gate: asyncio.Event) -> None:
    """Wait until the held generation's message passes input moderation; its first text waits here.

    A release lost on the way is found in the database within VERDICT_POLL_S. A verdict that blocks
    withdraws the answer: its stop cancels this wait, or the row is found gone (AnswerWithdrawn). With
    no verdict within INFERENCE_VERDICT_WAIT_S, the runner judges the message itself."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.INFERENCE_VERDICT_WAIT_S
    while not gate.is_set():
        try:
            await asyncio.wait_for(gate.wait(), VERDICT_POLL_S)
            return
        except TimeoutError:
            pass
        awaiting = await db_async(reconnecting(generation_awaiting_verdict))(generation_id=generation.id)
        if awaiting is None:
            raise AnswerWithdrawn
        if not awaiting:
            return
        if loop.time() >= deadline:
            logger.warning("generation %s: no verdict on its message came; judging it here", generation.id)
            await db_async(held_answer_judge)(generation_id=generation.id)
            deadline = float("inf")  # judged: the next look finds it released or withdrawn
