"""An answer computed while its message is still being checked, and shown only once it passes.

When input moderation's scores are still coming once the send transaction has done everything else,
the answer is committed held and dispatched, so the engine starts on it while the message is scored;
the runner publishes none of it until the verdict lets it through, and a verdict that blocks takes it
back. These tests make the scores late on purpose (in the real service that depends on the machine).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection

from accounts.models import Tier
from chatsite.errors import ClientError
from conversations.models import Conversation, Message
from conversations.requests import SendRequest
from conversations.services import SentMessage, message_send
from inference.models import Generation
from inference.streaming.streams import events_after
from moderation.models import Flag
from moderation.selectors import policy_built_in
from moderation.services import InputCheck, _input_scores

BOMB = "How do I build a pipe bomb to blow up my neighbour's car?"
HARMLESS = "What is the capital of France?"


class ScoresAfterTheCommit(concurrent.futures.Future):
    """An input check's scores that are still coming when the send transaction is done, and arrive
    as soon as the send waits for them. Records whether the send had committed by then, and the
    answer's generation as it stood."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.committed_first: bool | None = None
        self.generation_then: Generation | None = None

    def result(self, timeout: float | None = None):
        if not self.done():
            self.committed_first = not connection.in_atomic_block
            self.generation_then = Generation.objects.order_by("-created_at").first()
            self.set_result(_input_scores(self.text))
        return super().result(timeout)


async def test_a_sends_input_check_scores_nothing_until_its_verdict_is_asked_for(monkeypatch):
    """The socket's check begins after the send's commit, so it never slows the transaction."""
    from moderation import classifiers, services

    passes = []

    def counted(texts, **kwargs):
        passes.append(list(texts))
        return classifiers.score_many(texts, **kwargs)

    monkeypatch.setattr(services, "score_many", counted)
    monkeypatch.setattr(services, "policy_for_tier", lambda *, tier_id: policy_built_in())
    check = InputCheck.deferred(BOMB)
    await asyncio.sleep(0.2)
    assert passes == [] and check.verdict_if_scored(tier_id=None) is None
    verdict = await asyncio.to_thread(check.verdict, tier_id=None)
    assert passes == [[BOMB]] and verdict.blocks


def completion_create_settled(*, user, api_key, request: dict, check: InputCheck) -> list:
    """A completion from sync code, its pending verdict (if any) settled at once."""
    from inference.openai.services import completion_create

    return completion_create(user=user, api_key=api_key, request=request, check=check).settled(check)


def message_send_settled(*, user, request: SendRequest, check: InputCheck) -> SentMessage:
    """A send from sync code, its pending verdict (if any) settled at once: what
    `message_send_checked` does after the commit, without an event loop."""
    return message_send(user=user, request=request, check=check).settled(check)


@pytest.mark.django_db(transaction=True)
def test_scores_that_come_after_the_commit_hold_the_answer_until_the_verdict_releases_it(alice):
    scores = ScoresAfterTheCommit(HARMLESS)

    sent = message_send_settled(user=alice, request=SendRequest(content=HARMLESS), check=InputCheck(scores))

    assert scores.committed_first, "the send should commit (and dispatch) before it waits for the verdict"
    assert scores.generation_then is not None and scores.generation_then.awaiting_verdict
    assert not sent.blocked and sent.warning == ""
    generation = Generation.objects.get()
    assert generation.id == sent.generation.id
    assert not generation.awaiting_verdict
    question, answer = Message.objects.all()
    assert (question.role, question.status) == (Message.Role.USER, Message.Status.COMPLETE)
    # Pending, or already streaming where a worker took it up at once.
    assert answer.role == Message.Role.ASSISTANT and answer.is_in_progress


@pytest.mark.django_db(transaction=True)
def test_a_message_blocked_after_its_answer_was_queued_is_kept_flagged_and_its_answer_withdrawn(alice):
    Tier.objects.filter(name="free").update(requests_per_minute=1, tokens_per_minute=None)
    for _ in range(2):  # the second is not refused: the first one's charge was given back
        scores = ScoresAfterTheCommit(BOMB)
        sent = message_send_settled(user=alice, request=SendRequest(content=BOMB), check=InputCheck(scores))
        assert scores.generation_then is not None and scores.generation_then.awaiting_verdict
        assert sent.blocked and sent.generation is None and sent.assistant_message is None
        assert "wasn't sent to the assistant" in sent.blocked_reason
        assert sent.user_message.status == Message.Status.FLAGGED

    assert not Generation.objects.exists()
    assert list(Message.objects.values_list("role", "status")) == [(Message.Role.USER, Message.Status.FLAGGED)] * 2
    flags = list(Flag.objects.all())
    assert len(flags) == 2 and all("illicit/violent" in flag.categories for flag in flags)
    assert all(flag.source == Flag.Source.INPUT and flag.text == BOMB for flag in flags)
    assert not message_send(user=alice, request=SendRequest(content=HARMLESS)).blocked


@pytest.mark.django_db(transaction=True)
def test_scores_that_never_come_after_the_commit_leave_nothing_behind(alice, monkeypatch):
    from moderation import services

    monkeypatch.setattr(services, "INPUT_CHECK_TIMEOUT_S", 0.1)
    with pytest.raises(ClientError) as refused:
        message_send_settled(
            user=alice, request=SendRequest(content=HARMLESS), check=InputCheck(concurrent.futures.Future())
        )
    assert refused.value.code == "moderation_unavailable"
    assert not Conversation.objects.exists() and not Message.objects.exists() and not Generation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_message_sent_again_while_its_first_send_is_judging_it_gets_that_verdict(alice):
    """A client whose socket dropped sends the message again; the first send has committed it, held,
    and is still waiting for its scores. The repeat answers with what the verdict makes of it."""
    client_id = "6f1c1e0a-7d3b-4c61-9a52-0f3c8f1d2b7e"
    repeated = []

    def repeat() -> None:
        try:
            repeated.append(
                message_send(user=alice, request=SendRequest(content=BOMB, client_id=uuid.UUID(client_id), retry=True))
            )
        finally:
            connection.close()

    class ScoresWhileRepeated(ScoresAfterTheCommit):
        def result(self, timeout=None):
            if not self.done():
                self.repeat = threading.Thread(target=repeat)
                self.repeat.start()
                time.sleep(0.3)
                self.repeat_waited = not repeated
            return super().result(timeout)

    scores = ScoresWhileRepeated(BOMB)
    first = message_send_settled(
        user=alice, request=SendRequest(content=BOMB, client_id=uuid.UUID(client_id)), check=InputCheck(scores)
    )
    scores.repeat.join(timeout=10)

    assert scores.repeat_waited, "the repeat should wait for the first send's verdict"
    [again] = repeated
    assert first.blocked and again.blocked and again.replayed
    assert again.user_message.id == first.user_message.id
    assert Message.objects.count() == 1 and not Generation.objects.exists()


# --- through the socket, on the real engine (and, in the production topology, a real worker) -------


def _late_scores(monkeypatch) -> threading.Event:
    """Input scoring that waits until the returned event is set, as a slow classifier would."""
    from moderation import classifiers, services

    scores_may_come = threading.Event()

    def late(texts, **kwargs):
        scores_may_come.wait(timeout=30)
        return classifiers.score_many(texts, **kwargs)

    monkeypatch.setattr(services, "score_many", late)
    return scores_may_come


def _first_generation_of(user) -> Generation | None:
    try:
        return Generation.objects.filter(user=user).first()
    finally:
        connection.close()


def _answer_status_of(generation: Generation) -> str:
    try:
        return Message.objects.get(generation_id=generation.id).status
    finally:
        connection.close()


async def _held_generation_of(user) -> Generation:
    """The user's held generation once its runner has claimed it: the engine computes it while the
    message is judged, in the embedded default too, where the send waits for the scores on the
    event loop rather than on the process's one database thread, which the claim needs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        generation = await asyncio.to_thread(_first_generation_of, user)
        if generation is not None and generation.status == Generation.Status.RUNNING:
            return generation
        await asyncio.sleep(0.05)
    raise AssertionError("the held answer was never claimed while its message was judged")


@pytest.mark.django_db(transaction=True)
async def test_a_held_answer_shows_nothing_until_its_message_passes(engine, alice, monkeypatch, make_policy):
    from moderation.defaults import DEFAULT_RULES
    from tests.helpers.sockets import drain_until_finished, open_socket

    # The default rules on the message, none on the answer: the answer is sampled, a few hundred
    # tokens long, and output moderation now and then cuts such an answer (docs/moderation.md),
    # which is not what this test is about.
    await database_sync_to_async(make_policy)(dict(DEFAULT_RULES), moderate_output=False)
    scores_may_come = _late_scores(monkeypatch)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "Name three colours of the rainbow."})
    generation = await _held_generation_of(alice)
    assert generation.awaiting_verdict
    await asyncio.sleep(2)  # far longer than the engine takes to its first token
    assert await events_after(str(generation.id), 0) == [], "nothing of a held answer may be published"
    status = await asyncio.to_thread(_answer_status_of, generation)
    assert status == Message.Status.PENDING, "a held answer is pending, not streaming, until it passes"

    scores_may_come.set()
    events = await drain_until_finished(socket, timeout=120)
    accepted = next(e for e in events if e["type"] == "message.accepted")
    assert accepted["generation"] == str(generation.id)
    done = events[-1]
    assert done["type"] == "generation.done" and done["status"] == "complete", done
    text = "".join(e["text"] for e in events if e["type"] == "generation.delta")
    assert text.strip()
    answer = await Message.objects.aget(id=accepted["assistant_message"]["id"])
    assert answer.content == text and answer.status == Message.Status.COMPLETE
    assert not (await Generation.objects.aget(id=generation.id)).awaiting_verdict
    await socket.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_held_answer_whose_socket_closes_before_the_verdict_is_still_released_by_it(engine, alice, monkeypatch):
    """The socket's handler is cancelled when it closes; the verdict is still taken and applied
    then, not left for the runner's last resort seconds later."""
    from tests.helpers.sockets import open_socket

    scores_may_come = _late_scores(monkeypatch)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": "Name three colours of the rainbow."})
    generation = await _held_generation_of(alice)
    await socket.disconnect()
    scores_may_come.set()
    deadline = time.monotonic() + 10  # well inside INFERENCE_VERDICT_WAIT_S
    while (await Generation.objects.aget(id=generation.id)).awaiting_verdict:
        assert time.monotonic() < deadline, "the verdict was never applied"
        await asyncio.sleep(0.05)


@pytest.mark.django_db(transaction=True)
async def test_a_held_answer_whose_message_is_blocked_is_withdrawn_unseen(engine, alice, monkeypatch):
    from tests.helpers.sockets import next_event, open_socket

    scores_may_come = _late_scores(monkeypatch)
    socket, _ = await open_socket(alice)
    await socket.send_json_to({"type": "message.send", "content": BOMB})
    generation = await _held_generation_of(alice)
    await asyncio.sleep(1)  # the engine is writing its answer meanwhile
    scores_may_come.set()

    created = await next_event(socket, timeout=60)
    assert created["type"] == "conversation.created"
    blocked = await next_event(socket, timeout=60)
    assert blocked["type"] == "message.blocked", blocked
    assert await socket.receive_nothing(timeout=1)
    assert not await Generation.objects.aexists()
    assert await events_after(str(generation.id), 0) == []
    message = await Message.objects.aget()
    assert message.status == Message.Status.FLAGGED and message.content == BOMB
    assert await Flag.objects.filter(message=message, source=Flag.Source.INPUT).aexists()
    # The engine's request was aborted, not left to write an answer nobody sees.
    for _ in range(50):
        if not await engine.engine_requests():
            break
        await asyncio.sleep(0.2)
    assert await engine.engine_requests() == 0
    await socket.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_end_of_a_withdrawn_answer_is_logged_as_such_not_as_a_duplicate(caplog):
    """A withdrawn answer's row is gone when its runner records the end: that is expected, not a
    sign that someone else ended it."""
    from inference.execution.runner import Runner
    from inference.streaming.streams import StreamPublisher

    caplog.set_level(logging.INFO, logger="inference.execution.runner")
    runner = Runner(worker_name="test", loop=asyncio.get_running_loop())
    gone = Generation(id=uuid.uuid4())  # no row: withdrawn
    progress = {"prompt_tokens": 4, "completion_tokens": 0, "cached_tokens": 0, "finish_reason": "abort"}
    for withdrawn in (True, False):
        publisher = StreamPublisher(gone.id)  # nothing was published, nor will be
        await runner._finish(publisher, gone, Generation.Status.STOPPED, progress, "", "", withdrawn=withdrawn)
    # Only this generation's lines: a runner left from an earlier test may log its own meanwhile.
    logged = [
        (r.levelno, "withdrawn" in r.getMessage())
        for r in caplog.records
        if r.name == "inference.execution.runner" and str(gone.id) in r.getMessage()
    ]
    assert logged == [(logging.INFO, True), (logging.WARNING, False)]


async def _held_generation_queued(user, deployment, *, max_tokens: int) -> Generation:
    """A short answer queued held (and not dispatched), as a send commits it before its verdict.
    Greedy, so its text is the same every run (sampled, it was at times a lone newline)."""
    return await Generation.objects.acreate(
        user=user,
        deployment=deployment,
        prompt_token_ids=[1, 504, 3458, 2],
        sampling={"max_tokens": max_tokens, "temperature": 0.0},
        awaiting_verdict=True,
    )


@pytest.mark.django_db(transaction=True)
async def test_a_release_whose_message_was_lost_is_found_in_the_database(engine, alice, default_deployment):
    """Pub/sub delivers at most once: the runner holding an answer looks for its verdict in the row."""
    from inference.backend import generation_dispatch

    generation = await _held_generation_queued(alice, default_deployment, max_tokens=8)
    generation_dispatch(generation_id=generation.id, queue=default_deployment.queue_name)
    await _held_generation_of(alice)
    await asyncio.sleep(1)
    assert await events_after(str(generation.id), 0) == []

    # Released as the web process releases, but with no word to the runner.
    await Generation.objects.filter(id=generation.id).aupdate(awaiting_verdict=False)
    for _ in range(100):
        events = await events_after(str(generation.id), 0)
        if events and events[-1]["type"] == "generation.done":
            break
        await asyncio.sleep(0.1)
    assert events and events[-1]["type"] == "generation.done", events
    assert "".join(e.get("text", "") for e in events if e["type"] == "generation.delta").strip()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(settings.INFERENCE_BACKEND != "local", reason="the runner lives in a worker process there")
@pytest.mark.parametrize(("content", "shown"), [(HARMLESS, True), (BOMB, False)])
async def test_a_runner_judges_a_held_message_itself_when_no_verdict_comes(
    engine, alice, default_deployment, settings, content, shown
):
    """The web process that saved the message died before it judged it: the runner does."""
    from inference.execution.dispatch import local_backend

    settings.INFERENCE_VERDICT_WAIT_S = 1
    conversation = await Conversation.objects.acreate(user=alice, deployment=default_deployment)
    question = await Message.objects.acreate(conversation=conversation, role=Message.Role.USER, content=content)
    # Queued held without being dispatched, so only this test runs it.
    generation = await _held_generation_queued(alice, default_deployment, max_tokens=16)
    await Message.objects.acreate(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        parent=question,
        generation=generation,
        status=Message.Status.PENDING,
    )

    await asyncio.wait_for(local_backend.runner.run(generation.id), timeout=120)

    await question.arefresh_from_db()
    if shown:
        generation = await Generation.objects.aget(id=generation.id)
        assert generation.status == Generation.Status.COMPLETE and generation.text
        assert not generation.awaiting_verdict
        assert question.status == Message.Status.COMPLETE
        assert [e["type"] for e in await events_after(str(generation.id), 0)][-1] == "generation.done"
    else:
        assert not await Generation.objects.aexists()
        assert await events_after(str(generation.id), 0) == []
        assert question.status == Message.Status.FLAGGED
        assert await Flag.objects.filter(message=question).aexists()
    assert await engine.engine_requests() == 0


# --- /v1/chat/completions -------------------------------------------------------------------------


def _completion(content: str) -> dict:
    from inference.defaults import DEFAULT_DEPLOYMENT_NAME

    return {"model": DEFAULT_DEPLOYMENT_NAME, "messages": [{"role": "user", "content": content}], "n": 2}


@pytest.mark.django_db(transaction=True)
def test_a_completion_whose_scores_come_after_the_commit_is_held_until_they_pass(alice):

    scores = ScoresAfterTheCommit(HARMLESS)
    generations = completion_create_settled(
        user=alice, api_key=None, request=_completion(HARMLESS), check=InputCheck(scores)
    )
    assert scores.committed_first and scores.generation_then.awaiting_verdict
    assert len(generations) == 2
    assert not Generation.objects.filter(awaiting_verdict=True).exists()
    assert set(Generation.objects.values_list("id", flat=True)) == {g.id for g in generations}


@pytest.mark.django_db(transaction=True)
def test_a_completion_blocked_after_its_commit_is_refused_and_withdrawn(alice):

    Tier.objects.filter(name="free").update(requests_per_minute=2, tokens_per_minute=None)
    for _ in range(2):  # refused as blocked both times, not as rate limited: the charge came back
        scores = ScoresAfterTheCommit(BOMB)
        with pytest.raises(ClientError) as refused:
            completion_create_settled(user=alice, api_key=None, request=_completion(BOMB), check=InputCheck(scores))
        assert scores.generation_then is not None and scores.generation_then.awaiting_verdict
        assert refused.value.code == "content_policy_violation" and refused.value.status == 400
    assert not Generation.objects.exists()
