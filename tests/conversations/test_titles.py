"""Conversation titles: written by the model after the first answer, in a short generation of the
service's own that nobody is charged for; never from a message moderation held back."""

from __future__ import annotations

import pytest

from accounts.services import request_admit, request_limits
from billing.models import UsageRecord
from conversations.models import Conversation
from conversations.requests import SendRequest
from conversations.services import conversation_rename, message_send
from conversations.titles import TITLE_MAX_CHARS, title_clean, title_from_message
from inference.models import Generation
from inference.selectors import generation_tokens_reserved_for_user
from inference.services import SERVICE_PRIORITY, generation_finish

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
    assert titling.sampling["max_tokens"] <= 16
    with django_capture_on_commit_callbacks(execute=True):
        generation_finish(
            generation_id=titling.id,
            status="complete",
            text='Title: "The Capital of France."\nExtra line',
            finish_reason="stop",
        )
    assert Conversation.objects.get(id=sent.conversation.id).title == "The Capital of France"


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
        generation_finish(generation_id=titling.id, status="complete", text=' "..." ', finish_reason="stop")
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
