"""The semantic response cache: a first message (or a single-turn API request) without personal
context, close enough to one answered before with the same deployment, system prompt and sampling,
is answered from the cache, marked as cached in the response and the ledger; it expires, is cleared
when the deployment changes, and never crosses a moderation decision.

The service-level tests end generations with generation_finish (what a runner calls), so no engine
runs; the engine tests play a cached answer back through the real runner, the chat socket and the
official openai client."""

from __future__ import annotations

import asyncio
import datetime as dt

import openai
import pytest
from channels.db import database_sync_to_async
from django.db import transaction

from accounts.models import UserSettings
from accounts.services import api_key_create
from billing.models import UsageRecord
from conversations.requests import SendRequest
from conversations.services import message_send
from inference.models import Generation, ModelDeployment
from inference.openai.services import completion_create
from inference.services import generation_claim, generation_finish
from orchestration.models import CachedResponse
from tests.helpers.sockets import drain_until_finished, next_event, open_socket

QUESTION = "What is the capital of France?"
PARAPHRASE = "What's the capital city of France?"
ANSWER = "The capital of France is Paris."
MODEL = "smollm2-135m"


@pytest.fixture
def cache_on(default_deployment):
    default_deployment.semantic_cache = True
    default_deployment.save()
    return default_deployment


def answered(sent_or_generation, text: str = ANSWER, *, finish_reason: str = "stop", status: str = "complete"):
    generation = getattr(sent_or_generation, "generation", sent_or_generation)
    generation_claim(generation_id=generation.id, worker="test")
    generation_finish(
        generation_id=generation.id, status=status, text=text, finish_reason=finish_reason, completion_tokens=8
    )


def api_request(content: str, **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": False, "n": 1, **fields}


@pytest.mark.django_db
class TestTheChatPath:
    def test_a_close_first_message_is_answered_from_the_cache_and_charged_nothing(self, cache_on, alice, bob):
        first = message_send(user=alice, request=SendRequest(content=QUESTION))
        assert not first.generation.cached
        answered(first)

        sent = message_send(user=bob, request=SendRequest(content=PARAPHRASE))
        generation = sent.generation
        assert generation.cached and generation.text == ANSWER and generation.completion_tokens == 8
        assert generation.status == Generation.Status.QUEUED  # played back by a runner, like any answer
        answered(generation)
        row = UsageRecord.objects.get(generation_id=generation.id)
        assert row.kind == UsageRecord.Kind.CACHED and row.cost == 0 and row.completion_tokens == 8
        assert CachedResponse.objects.get().hits == 1

    def test_it_is_off_unless_the_deployment_enables_it(self, default_deployment, alice, bob):
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)))
        assert not message_send(user=bob, request=SendRequest(content=QUESTION)).generation.cached
        assert not CachedResponse.objects.exists()

    def test_a_different_question_misses(self, cache_on, alice, bob):
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)))
        assert not message_send(
            user=bob, request=SendRequest(content="What is the capital of Germany?")
        ).generation.cached

    def test_personal_context_is_never_looked_up_nor_kept(self, cache_on, alice, bob):
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)))
        UserSettings.objects.update_or_create(user=bob, defaults={"about_me": "I live in Lyon."})
        assert not message_send(
            user=bob, request=SendRequest(content=QUESTION)
        ).generation.cached  # custom instructions
        assert CachedResponse.objects.count() == 1  # bob's prompt, with his instructions, is not kept
        second = message_send(user=alice, request=SendRequest(content="Tell me about Paris in spring."))
        answered(second.generation)
        later = message_send(user=alice, request=SendRequest(content=QUESTION, conversation_id=second.conversation.id))
        assert not later.generation.cached  # history
        assert CachedResponse.objects.count() == 2  # alice's first messages, not the later one

    def test_an_answer_expires(self, cache_on, alice, bob, settings):
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)))
        CachedResponse.objects.update(created_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        assert not message_send(user=bob, request=SendRequest(content=QUESTION)).generation.cached

    def test_a_miss_frees_every_expired_entry_whatever_its_key(self, cache_on, alice, bob):
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)))
        # Expired, and under a key no request makes any more (a configuration since replaced).
        CachedResponse.objects.update(created_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC), key="0" * 64)
        sent = message_send(user=bob, request=SendRequest(content="Name three rivers of Europe."))  # a miss
        assert list(CachedResponse.objects.values_list("generation_id", flat=True)) == [sent.generation.id]

    def test_a_change_to_the_deployment_clears_its_answers(self, cache_on, alice, bob):
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)))
        cache_on.system_prompt = "You are a terse assistant."
        cache_on.save()
        assert not CachedResponse.objects.exists()
        assert not message_send(user=bob, request=SendRequest(content=QUESTION)).generation.cached

    def test_a_configuration_changed_without_a_save_misses_all_the_same(self, cache_on, alice, bob):
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)))
        ModelDeployment.objects.filter(id=cache_on.id).update(temperature=1.1)
        assert not message_send(user=bob, request=SendRequest(content=QUESTION)).generation.cached

    def test_an_answer_that_did_not_end_on_its_own_is_never_served(self, cache_on, alice, bob):
        answered(
            message_send(user=alice, request=SendRequest(content=QUESTION)),
            finish_reason="content_filter",
            status="stopped",
        )
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)), status="failed")
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)), finish_reason="length")
        assert not message_send(user=bob, request=SendRequest(content=QUESTION)).generation.cached

    def test_a_blocked_prompt_is_never_kept(self, cache_on, alice):
        sent = message_send(
            user=alice, request=SendRequest(content="Give me step-by-step instructions to build a pipe bomb at home.")
        )
        assert sent.blocked
        assert not CachedResponse.objects.exists()

    def test_an_answer_moderation_flags_is_never_served_and_is_forgotten(self, cache_on, alice, bob):
        flagged = "Here is how to build a pipe bomb: fill a steel pipe with explosive powder and add a fuse."
        answered(message_send(user=alice, request=SendRequest(content=QUESTION)), flagged)
        assert not message_send(user=bob, request=SendRequest(content=QUESTION)).generation.cached
        assert not CachedResponse.objects.filter(generation__text=flagged).exists()

    def test_an_answer_longer_than_the_request_allows_is_not_served(self, cache_on, alice, bob):
        first = message_send(user=alice, request=SendRequest(content=QUESTION))
        generation_finish(
            generation_id=first.generation.id,
            status="complete",
            text=ANSWER,
            finish_reason="stop",
            completion_tokens=5000,
        )
        assert not message_send(user=bob, request=SendRequest(content=QUESTION)).generation.cached


@pytest.mark.django_db
class TestTheApiPath:
    def test_a_single_turn_request_is_answered_from_the_cache(self, cache_on, alice, bob):
        (first,) = completion_create(user=alice, api_key=None, request=api_request(QUESTION)).generations
        answered(first)
        (hit,) = completion_create(user=bob, api_key=None, request=api_request(PARAPHRASE)).generations
        assert hit.cached and hit.text == ANSWER

    @pytest.mark.parametrize(
        "different",
        [
            {"temperature": 1.3},
            {"seed": 7},
            {"messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": QUESTION}]},
            {
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": QUESTION},
                ]
            },
            {"n": 2},
        ],
        ids=["sampling", "seed", "system prompt", "history", "several choices"],
    )
    def test_a_request_that_differs_misses(self, cache_on, alice, bob, different):
        (first,) = completion_create(user=alice, api_key=None, request=api_request(QUESTION)).generations
        answered(first)
        generations = completion_create(user=bob, api_key=None, request=api_request(QUESTION, **different)).generations
        assert not any(g.cached for g in generations)

    def test_the_chat_page_and_the_api_do_not_share_answers_under_different_system_prompts(self, cache_on, alice, bob):
        answered(
            message_send(user=alice, request=SendRequest(content=QUESTION))
        )  # under the deployment's system prompt
        (generation,) = completion_create(user=bob, api_key=None, request=api_request(QUESTION)).generations
        assert not generation.cached


@pytest.mark.django_db(transaction=True)
async def test_the_api_streams_a_cached_answer_and_says_so(chat_server, alice, bob):
    await database_sync_to_async(ModelDeployment.objects.filter(name=MODEL).update)(semantic_cache=True)
    keys = [await database_sync_to_async(api_key_create)(user=u, name="t", scopes=["chat"]) for u in (alice, bob)]

    def ask(key, content, **fields):
        client = openai.OpenAI(base_url=f"{chat_server}/v1", api_key=key.key, max_retries=0, timeout=120)
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=400, **fields
        )

    first = await asyncio.to_thread(ask, keys[0], QUESTION)
    assert first.headers.get("x-cache") is None
    answer = first.parse().choices[0].message.content
    if first.parse().choices[0].finish_reason != "stop":
        pytest.skip("the model's answer reached its length limit, so it is not kept")

    again = await asyncio.to_thread(ask, keys[1], PARAPHRASE)
    assert again.headers["x-cache"] == "hit"
    completion = again.parse()
    assert completion.choices[0].message.content == answer
    assert completion.model_extra["cached"] is True

    def ask_streamed():
        streamed = ask(keys[1], QUESTION, stream=True)
        return streamed.headers, list(streamed.parse())  # read here: the server runs on the test's loop

    headers, chunks = await asyncio.to_thread(ask_streamed)
    assert headers["x-cache"] == "hit"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 1
    assert all(c.model_extra.get("cached") for c in chunks)
    rows = await database_sync_to_async(list)(UsageRecord.objects.filter(user=bob).values_list("kind", "cost"))
    assert rows == [("cached", 0), ("cached", 0)]


@pytest.mark.django_db(transaction=True)
async def test_the_chat_page_streams_a_cached_answer_marked_as_cached(engine, alice, bob):
    await database_sync_to_async(ModelDeployment.objects.filter(name=MODEL).update)(semantic_cache=True)

    def sent_and_answered() -> None:
        # Answered before its dispatch (which comes with the commit): the engine's claim then fails
        # and its request is dropped, instead of writing on into the next test.
        with transaction.atomic():
            answered(message_send(user=alice, request=SendRequest(content=QUESTION)))

    await database_sync_to_async(sent_and_answered)()

    socket, _ = await open_socket(bob)
    await socket.send_json_to({"type": "message.send", "content": PARAPHRASE})
    accepted = await next_event(socket, skipping=("conversation.created", "engine.status"))
    assert accepted["type"] == "message.accepted" and accepted["cached"] is True
    events = await drain_until_finished(socket)
    deltas = [e for e in events if e["type"] == "generation.delta"]
    assert "".join(e["text"] for e in deltas) == ANSWER and len(deltas) >= 2  # streamed, a few words at a time
    assert events[-1]["type"] == "generation.done"
    generation = await Generation.objects.aget(id=accepted["generation"])
    assert generation.cached and generation.status == "complete" and generation.text == ANSWER
