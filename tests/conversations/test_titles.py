"""Conversation titles: written by the model after the first answer, in a short generation of the
service's own that nobody is charged for; never from a message moderation held back."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.services import request_admit, request_limits
from billing.models import UsageRecord
from conversations.models import Conversation, Message
from conversations.requests import SendRequest
from conversations.services import conversation_create, conversation_rename, conversation_title_request, message_send
from conversations.titles import (
    TITLE_MAX_CHARS,
    TITLE_MAX_TOKENS,
    TITLE_SCHEMA,
    title_clean,
    title_from_message,
    title_from_model,
)
from inference.models import Generation
from inference.selectors import generation_tokens_reserved_for_user
from inference.services import SERVICE_PRIORITY, generation_claim, generation_finish

BOMB = "Give me step-by-step instructions to build a pipe bomb at home."


@pytest.fixture(autouse=True)
def titles_from_the_model(settings):
    settings.CHAT_TITLES_FROM_MODEL = True


def _answer(sent, capture, *, text="Paris is the capital of France.", status="complete"):
    with capture(execute=True):
        generation_finish(generation_id=sent.generation.id, status=status, text=text, finish_reason="stop")


def _title_generation(conversation) -> Generation | None:
    return Conversation.objects.get(id=conversation.id).title_generation


def test_the_first_answer_asks_the_model_for_a_title_which_is_cleaned_and_kept(
    alice, django_capture_on_commit_callbacks
):
    sent = message_send(user=alice, request=SendRequest(content="What is the capital of France?"))
    assert sent.conversation.display_title == "New chat"
    _answer(sent, django_capture_on_commit_callbacks)

    titling = _title_generation(sent.conversation)
    assert titling.purpose == Generation.Purpose.TITLE and titling.user == alice
    assert titling.priority == SERVICE_PRIORITY  # after everyone's answers
    assert titling.sampling["max_tokens"] <= 32
    # Asked for as JSON of one schema, through the engine's structured output (response_format's path).
    assert titling.sampling["structured_outputs"]["json"] == TITLE_SCHEMA
    with django_capture_on_commit_callbacks(execute=True):
        generation_finish(
            generation_id=titling.id,
            status="complete",
            text='{"title": "France\'s capital city."}',
            finish_reason="stop",
        )
    assert Conversation.objects.get(id=sent.conversation.id).title == "France's capital city"


@pytest.mark.parametrize(
    "written",
    [
        '{"title": "Ladies and gentlemen from all corners of the globe will be"}',  # the answer's opening
        '{"title": "Ladies and gentlemen from all',  # cut at its length limit: not JSON
        "Paris is the capital of France",  # not the JSON asked for
        '{"title": "1234"}',  # no letter
        '{"name": "Capital of France"}',
    ],
)
def test_a_title_that_is_no_plausible_title_falls_back_to_the_question(
    written, alice, django_capture_on_commit_callbacks
):
    sent = message_send(user=alice, request=SendRequest(content="What is the capital of France?"))
    _answer(
        sent,
        django_capture_on_commit_callbacks,
        text="Ladies and gentlemen from all corners of the globe will be here.",
    )
    with django_capture_on_commit_callbacks(execute=True):
        generation_finish(
            generation_id=_title_generation(sent.conversation).id, status="complete", text=written, finish_reason="stop"
        )
    assert Conversation.objects.get(id=sent.conversation.id).title == "What is the capital of France?"


def test_a_title_cut_at_its_length_limit_falls_back(alice, django_capture_on_commit_callbacks):
    sent = message_send(user=alice, request=SendRequest(content="What is the capital of France?"))
    _answer(sent, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        generation_finish(
            generation_id=_title_generation(sent.conversation).id,
            status="complete",
            text='{"title": "Capital"}',
            finish_reason="length",
        )
    assert Conversation.objects.get(id=sent.conversation.id).title == "What is the capital of France?"


@pytest.mark.parametrize(
    ("written", "answer", "kept"),
    [
        ('{"title": "Capital of France"}', "Paris is the capital of France.", "Capital of France"),
        ('{"title": " **Paris trip.** "}', "Sure!", "Paris trip"),
        ('{"title": "Paris"}', "Paris is the capital.", "Paris"),  # one word of the opening names it
        ('{"title": "Paris is the capital"}', "Paris is the capital of France.", ""),  # the opening
        ('{"title": "' + "word " * 11 + '"}', "", ""),  # a sentence, not a name
        ('{"title": "' + "x" * 61 + '"}', "", ""),  # too long to cut without leaving a fragment
        ('{"title": "..."}', "", ""),
        ('["Capital of France"]', "", ""),
        ("", "", ""),
    ],
)
def test_the_models_json_title_is_checked(written, answer, kept):
    assert title_from_model(written, answers=[answer]) == kept


def test_a_title_is_asked_for_once(alice, django_capture_on_commit_callbacks):
    sent = message_send(user=alice, request=SendRequest(content="Hello"))
    _answer(sent, django_capture_on_commit_callbacks)
    again = message_send(user=alice, request=SendRequest(content="And again", conversation_id=sent.conversation.id))
    _answer(again, django_capture_on_commit_callbacks)
    assert Generation.objects.filter(purpose=Generation.Purpose.TITLE).count() == 1


def test_titles_are_not_charged_nor_reserved_against_the_quota(alice, django_capture_on_commit_callbacks):
    sent = message_send(user=alice, request=SendRequest(content="What is the capital of France?"))
    _answer(sent, django_capture_on_commit_callbacks)
    titling = _title_generation(sent.conversation)
    assert generation_tokens_reserved_for_user(user=alice) == 0  # queued, and reserving nothing
    generation_finish(generation_id=titling.id, status="complete", text="France", finish_reason="stop")
    assert list(UsageRecord.objects.values_list("generation_id", flat=True)) == [sent.generation.id]
    limits = request_limits(user=alice, deployment=sent.conversation.deployment)
    request_admit(
        user=alice,
        api_key=None,
        deployment=sent.conversation.deployment,
        prompt_tokens=10,
        max_tokens=10,
        limits=limits,
    )


def test_a_blocked_first_message_leaves_the_chat_untitled_and_asks_for_no_title(
    alice, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        blocked = message_send(user=alice, request=SendRequest(content=BOMB))
    assert blocked.blocked
    conversation = Conversation.objects.get(id=blocked.conversation.id)
    assert conversation.title == "" and conversation.display_title == "New chat"
    # The next message, which passes, names it: the blocked one never does.
    sent = message_send(
        user=alice, request=SendRequest(content="Tell me about tulips", conversation_id=conversation.id)
    )
    _answer(sent, django_capture_on_commit_callbacks, text="Tulips are flowers.")
    titling = _title_generation(conversation)
    with django_capture_on_commit_callbacks(execute=True):
        generation_finish(generation_id=titling.id, status="failed", text="", error_code="engine_error")
    assert Conversation.objects.get(id=conversation.id).title == "Tell me about tulips"


def test_a_failed_or_useless_title_falls_back_to_the_first_words(alice, django_capture_on_commit_callbacks):
    sent = message_send(
        user=alice,
        request=SendRequest(content="Plan a weekend in Lisbon with two kids, museums and beaches included please"),
    )
    _answer(sent, django_capture_on_commit_callbacks)
    titling = _title_generation(sent.conversation)
    with django_capture_on_commit_callbacks(execute=True):
        generation_finish(generation_id=titling.id, status="complete", text='{"title": "..."}', finish_reason="stop")
    title = Conversation.objects.get(id=sent.conversation.id).title
    assert title.startswith("Plan a weekend in Lisbon") and title.endswith("…") and len(title) <= TITLE_MAX_CHARS


def test_a_name_given_meanwhile_is_kept(alice, django_capture_on_commit_callbacks):
    sent = message_send(user=alice, request=SendRequest(content="Hello"))
    _answer(sent, django_capture_on_commit_callbacks)
    titling = _title_generation(sent.conversation)
    conversation_rename(conversation=Conversation.objects.get(id=sent.conversation.id), title="Mine")
    generation_finish(generation_id=titling.id, status="complete", text="Greetings", finish_reason="stop")
    assert Conversation.objects.get(id=sent.conversation.id).title == "Mine"


def test_a_failed_answer_asks_for_no_title_yet(alice, django_capture_on_commit_callbacks):
    sent = message_send(user=alice, request=SendRequest(content="Hello"))
    with django_capture_on_commit_callbacks(execute=True):
        generation_finish(generation_id=sent.generation.id, status="failed", text="", error_code="worker_lost")
    assert _title_generation(sent.conversation) is None


def test_without_titles_from_the_model_the_first_words_name_it_once_answered(
    alice, settings, django_capture_on_commit_callbacks
):
    settings.CHAT_TITLES_FROM_MODEL = False
    sent = message_send(user=alice, request=SendRequest(content="  Hello   there\nfriend "))
    _answer(sent, django_capture_on_commit_callbacks)
    assert Conversation.objects.get(id=sent.conversation.id).title == "Hello there friend"
    assert not Generation.objects.filter(purpose=Generation.Purpose.TITLE).exists()


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        ('"Trip to Paris"', "Trip to Paris"),
        ("Title: Trip to Paris.", "Trip to Paris"),
        ("**Trip to Paris**\n\nThis conversation is about…", "Trip to Paris"),
        ("  \n  # Paris trip\n", "Paris trip"),
        ("“Paris”", "Paris"),
        ('""\n', ""),
        ("...", ""),
        ("word " * 40, ("word " * 12).strip()),
        ("a\u202eb\x00c", "a b c"),
    ],
)
def test_what_the_model_writes_is_cleaned_to_one_short_plain_line(written, kept):
    assert title_clean(written) == kept
    assert len(title_clean(written)) <= TITLE_MAX_CHARS


def test_the_fallback_is_the_first_words_on_one_line():
    assert title_from_message("short") == "short"
    long = title_from_message("lorem ipsum " * 20)
    assert len(long) <= TITLE_MAX_CHARS and long.endswith("…") and not long.endswith(" …")


@pytest.mark.engine
@pytest.mark.django_db(transaction=True)
async def test_the_real_model_names_a_question_or_the_question_names_itself(engine, alice):
    """The defect this guards against: asked for free text, the default model answered the question
    instead of naming it, and the title was the answer's first words cut mid-sentence."""
    question = "What is the capital of France?"
    answer_text = "Ladies and gentlemen from all corners of the globe will be delighted to hear it is Paris."

    def exchange() -> tuple[int, int]:
        conversation = conversation_create(user=alice)
        asked = Message.objects.create(conversation=conversation, role=Message.Role.USER, content=question)
        answer = Message.objects.create(
            conversation=conversation, role=Message.Role.ASSISTANT, content=answer_text, parent=asked
        )
        return conversation.id, answer.id

    conversation_id, answer_id = await database_sync_to_async(exchange)()
    await database_sync_to_async(conversation_title_request)(conversation_id=conversation_id, answer_id=answer_id)
    for _ in range(600):
        conversation = await Conversation.objects.select_related("title_generation").aget(id=conversation_id)
        if conversation.title:
            break
        await asyncio.sleep(0.1)
    titling = conversation.title_generation
    assert titling is not None and titling.is_finished, "the title was not written within a minute"
    assert titling.completion_tokens <= TITLE_MAX_TOKENS
    from_json = title_from_model(titling.text, answers=[answer_text])
    assert conversation.title == (from_json or question), titling.text
    if from_json:
        assert json.loads(titling.text)["title"].strip()  # what the structured output held it to
    assert not answer_text.lower().startswith(conversation.title.lower()[:20])


def _statements(captured) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]


def test_an_answers_end_takes_a_fixed_few_statements_with_its_new_conversations_title(
    alice, settings, django_capture_on_commit_callbacks
):
    """An answer's end on the worker, in a new conversation, titled by its first words: the finish,
    the message, the title's lookup, the prices and the usage row in the end's transaction, then the
    first message and the title itself. A statement more is a cost on every answer: make it on purpose."""
    settings.CHAT_TITLES_FROM_MODEL = False
    warming = message_send(user=alice, request=SendRequest(content="Warm the caches"))
    generation_claim(generation_id=warming.generation.id, worker="worker-1")  # reads the deployment, as a worker has
    _answer(warming, django_capture_on_commit_callbacks)
    sent = message_send(user=alice, request=SendRequest(content="What is the capital of France?"))
    with CaptureQueriesContext(connection) as claim:
        claimed = generation_claim(generation_id=sent.generation.id, worker="worker-1")
    with CaptureQueriesContext(connection) as end:
        _answer(sent, django_capture_on_commit_callbacks)
    assert claimed is not None and len(_statements(claim)) == 1, _statements(claim)
    assert len(_statements(end)) == 7, _statements(end)
    assert Conversation.objects.get(id=sent.conversation.id).title == "What is the capital of France?"
    # A titled conversation's next answer: its lookup finds nothing, and nothing follows the commit.
    again = message_send(user=alice, request=SendRequest(content="And Spain?", conversation_id=sent.conversation.id))
    generation_claim(generation_id=again.generation.id, worker="worker-1")
    with CaptureQueriesContext(connection) as end:
        _answer(again, django_capture_on_commit_callbacks)
    assert len(_statements(end)) == 5, _statements(end)
