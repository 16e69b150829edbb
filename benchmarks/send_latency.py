"""How long the web process takes to accept a chat message, and a worker to record its answer's
end, without the engine.

The chat socket's path from a message to its dispatch: `message_send`'s transaction on PostgreSQL,
which commits the answer held, then the Celery task sent through Redis; then the input check scoring
the text in a thread, and its verdict releasing the answer. It runs in this process, as it does in a
web process, at concurrency 1 (one message after another) and 8 (eight messages sent together), and
prints:

- c=1: the time from the message to its dispatch, p50 and p90, and to its acceptance (the send
  returns once the verdict is taken, after the dispatch, the answer held meanwhile), and in how many
  sends the answer was held; and the same send with the verdict taken before (the transaction
  alone) and the input check alone (its scoring; the transaction reads the policy);
- the transaction alone for the conversation's second message (its history read into the prompt,
  the conversation locked against other sends into it), the chat's most common send;
- the transaction alone again, sent back to back instead of after a pause (what an idle machine's
  waking up costs a message: the pauses above are what a message at c=1 finds);
- c=8: when the first, the fourth and the last of the eight were dispatched (medians over rounds);
- the new connections to Redis per message (a process should need none once it is warm);
- the end: an answer's end recorded (`generation_finish` through `db_async`, as the runner calls
  it once the last words have passed their check: the generation, its message and the usage
  charge in one transaction), p50 and p90, each after one of the c=1 messages above.

No worker consumes the tasks: each generation is claimed and ended right away, outside the send's
timing, and the Redis database is emptied at the end. Needs PostgreSQL and Redis: `make
benchmark-send` (`python -m benchmarks send`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from benchmarks.harness import result
from benchmarks.stack import PROMPTS, setup_django

ALONE = 60
TOGETHER_ROUNDS = 20
WARM_UP = 2


async def measure() -> None:
    import redis
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from accounts.models import Tier
    from accounts.services import user_set_tier
    from chatsite.database import db_async
    from conversations.requests import SendRequest
    from conversations.services import answering as conversation_services
    from conversations.services import message_send, message_send_checked
    from inference.execution import dispatch as dispatch_module
    from inference.models import Generation
    from inference.services import generation_claim, generation_finish
    from moderation.selectors import policy_for_user
    from moderation.services import InputCheck, input_scorer, verdict_from_scores

    user, _ = await asyncio.to_thread(get_user_model().objects.get_or_create, username="benchmark-send")
    # The plan with the highest limits, so no send is refused over the run.
    await asyncio.to_thread(user_set_tier, user=user, tier=await Tier.objects.aget(name="enterprise"))
    policy = await asyncio.to_thread(policy_for_user, user=user)  # what the transaction would read
    # The classifiers load on first use, as in a web process: in the warm-up, outside the figures.
    client = redis.Redis.from_url(settings.REDIS_URL)
    # When each generation was dispatched (at the send's commit), and how many sends held their
    # answer (committed it before the verdict was in): the send returns only once it is.
    dispatched_at: dict[str, float] = {}
    dispatch = dispatch_module.generation_dispatch
    create = conversation_services.generation_create
    holds = []

    def timed_dispatch(*, generation_id, **kwargs) -> None:
        dispatch(generation_id=generation_id, **kwargs)
        dispatched_at[str(generation_id)] = time.perf_counter()

    def counted_create(**kwargs):
        generation = create(**kwargs)
        if generation.awaiting_verdict:
            holds.append(generation.id)
        return generation

    dispatch_module.generation_dispatch = timed_dispatch
    conversation_services.generation_create = counted_create

    ended = []  # ms to record each c=1 answer's end

    async def end(generation_id, text: str) -> None:
        """Claim the generation and record its end as a worker does, timing the end."""
        await db_async(generation_claim)(generation_id=generation_id, worker="benchmark-send")
        started = time.perf_counter()
        await db_async(generation_finish)(
            generation_id=generation_id,
            status=Generation.Status.COMPLETE,
            text=text,
            finish_reason="length",
            prompt_tokens=40,
            completion_tokens=64,
        )
        ended.append((time.perf_counter() - started) * 1000)

    async def send(text: str, started: float, verdict=None, into=None) -> tuple[float, float, int]:
        """(ms to its dispatch, ms to its acceptance, its conversation's id) of one message, into a
        new conversation or the conversation `into`."""
        # As the chat socket does it: a task of its own (a context of its own), the check scored
        # after the commit; or, given the verdict taken before, the transaction alone.
        if verdict is None:
            request = SendRequest(content=text, conversation_id=into)
            sent = await message_send_checked(db_async, user=user, request=request)
        else:
            request = SendRequest(content=text, conversation_id=into)
            sent = await db_async(message_send)(user=user, request=request, check=InputCheck.decided(verdict))
        accepted = time.perf_counter() - started
        dispatched = dispatched_at.pop(str(sent.generation.id)) - started
        await end(sent.generation.id, text)
        return dispatched * 1000, accepted * 1000, sent.conversation.id

    connections_before = client.info("stats")["total_connections_received"]
    alone, accepted, judged, checked, followed = [], [], [], [], []
    verdicts = {}
    for i in range(ALONE + WARM_UP):
        text = PROMPTS[i % len(PROMPTS)]
        if i == WARM_UP:
            holds.clear()
        took, took_accepting, _ = await asyncio.create_task(send(text, time.perf_counter()))
        await asyncio.sleep(0.05)
        # The input check alone, timed as the send runs it after its commit: the scoring (the
        # transaction reads the policy). Its verdict is the one the transaction alone is then given.
        started = time.perf_counter()
        scores = await input_scorer().score(text)
        took_checking = (time.perf_counter() - started) * 1000
        verdict = verdicts[text] = verdict_from_scores(scores=scores, policy=policy)
        await asyncio.sleep(0.05)
        took_judged, _, conversation_id = await asyncio.create_task(send(text, time.perf_counter(), verdict))
        await asyncio.sleep(0.05)
        # The same again as the conversation's next message (its history in the prompt).
        took_following, _, _ = await asyncio.create_task(send(text, time.perf_counter(), verdict, into=conversation_id))
        if i >= WARM_UP:
            alone.append(took)
            accepted.append(took_accepting)
            judged.append(took_judged)
            checked.append(took_checking)
            followed.append(took_following)
        await asyncio.sleep(0.05)
    held_at_c1 = len(holds)
    ended_at_c1 = sorted(ended[3 * WARM_UP :])
    back_to_back = []
    for i in range(ALONE + WARM_UP):
        text = PROMPTS[i % len(PROMPTS)]
        took, _, _ = await asyncio.create_task(send(text, time.perf_counter(), verdicts[text]))
        if i >= WARM_UP:
            back_to_back.append(took)
    together = []
    for i in range(TOGETHER_ROUNDS + WARM_UP):
        started = time.perf_counter()
        done = sorted(
            dispatched for dispatched, _, _ in await asyncio.gather(*(send(text, started) for text in PROMPTS))
        )
        if i >= WARM_UP:
            together.append(done)
        await asyncio.sleep(0.2)
    messages = 4 * (ALONE + WARM_UP) + (TOGETHER_ROUNDS + WARM_UP) * len(PROMPTS)
    new_connections = client.info("stats")["total_connections_received"] - connections_before
    client.flushdb()

    alone.sort()
    print(
        f"c=1 dispatched: p50 {statistics.median(alone):.1f} ms, p90 {alone[len(alone) * 9 // 10]:.1f} ms; "
        f"accepted (the verdict taken): p50 {statistics.median(accepted):.1f} ms; "
        f"the answer held for the verdict in {held_at_c1} of {ALONE}"
    )
    first, fourth, last = (statistics.median(r[k] for r in together) for k in (0, 3, -1))
    print(
        f"c=1 the transaction alone (verdict taken before): p50 {statistics.median(judged):.1f} ms; "
        f"the input check alone: p50 {statistics.median(checked):.1f} ms"
    )
    print(f"c=1 the transaction alone, the conversation's second message: p50 {statistics.median(followed):.1f} ms")
    print(f"c=1 the transaction alone, back to back: p50 {statistics.median(back_to_back):.1f} ms")
    print(f"c=8 dispatched: first {first:.1f} ms, fourth {fourth:.1f} ms, last {last:.1f} ms")
    print(f"new Redis connections per message: {new_connections / messages:.2f}")
    print(
        f"c=1 an answer's end recorded (generation_finish): p50 {statistics.median(ended_at_c1):.1f} ms, "
        f"p90 {ended_at_c1[len(ended_at_c1) * 9 // 10]:.1f} ms"
    )
    result(
        dispatched_c1_p50_ms=round(statistics.median(alone), 1),
        transaction_p50_ms=round(statistics.median(judged), 1),
        second_message_p50_ms=round(statistics.median(followed), 1),
        back_to_back_p50_ms=round(statistics.median(back_to_back), 1),
        c8_last_dispatched_ms=round(last, 1),
        end_recorded_p50_ms=round(statistics.median(ended_at_c1), 1),
    )


def run(args: argparse.Namespace) -> None:
    setup_django()
    asyncio.run(measure())
