from __future__ import annotations

import pytest

from chatsite.errors import ClientError
from conversations.models import Conversation, Message
from conversations.services import conversation_rename, message_send
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.models import Generation
from inference.services import generation_claim, generation_finish, generation_mark_started, generation_request_stop


def test_sending_a_first_message_creates_the_conversation_and_a_pending_answer(alice):
    sent = message_send(user=alice, content="  Hello there  ")
    assert sent.conversation_created
    assert sent.conversation.user == alice
    assert sent.conversation.title == "Hello there"
    assert sent.user_message.content == "Hello there"
    assert sent.user_message.token_count > 0
    assert sent.assistant_message.status == Message.Status.PENDING
    assert sent.assistant_message.parent == sent.user_message
    generation = sent.generation
    assert generation.status == Generation.Status.QUEUED
    assert generation.user == alice
    assert generation.sampling["repetition_penalty"] == DEFAULT_DEPLOYMENT_FIELDS["repetition_penalty"]
    assert generation.prompt_tokens == len(generation.prompt_token_ids)
    assert generation.sampling["max_tokens"] + generation.prompt_tokens <= 2048


@pytest.mark.parametrize("content", ["", "   ", None, 42, "a\x00b", "x" * 40_000])
def test_bad_messages_are_refused_and_leave_nothing_behind(alice, content):
    with pytest.raises(ClientError):
        message_send(user=alice, content=content)
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()
    assert not Generation.objects.exists()


def test_a_message_too_long_for_the_window_leaves_nothing_behind(alice):
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, content=" ".join(["overflow"] * 2500))
    assert refused.value.code == "context_length_exceeded"
    assert not Message.objects.exists()


def test_it_refuses_another_users_conversation(alice, bob):
    bobs = message_send(user=bob, content="Bob's secret").conversation
    _finish(bobs)
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, content="Let me in", conversation_id=bobs.id)
    assert refused.value.code == "not_found"
    assert bobs.messages.count() == 2


def test_a_new_message_moves_its_conversation_to_the_top_of_the_list(alice):
    older = message_send(user=alice, content="First conversation").conversation
    _finish(older)
    newer = message_send(user=alice, content="Second conversation").conversation
    _finish(newer)
    assert list(Conversation.objects.filter(user=alice)) == [newer, older]
    message_send(user=alice, content="Back to the first", conversation_id=older.id)
    assert list(Conversation.objects.filter(user=alice)) == [older, newer]


def test_a_second_message_waits_for_the_answer_in_progress(alice):
    sent = message_send(user=alice, content="First")
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, content="Second", conversation_id=sent.conversation.id)
    assert refused.value.code == "generation_in_progress"
    assert sent.conversation.messages.count() == 2


def test_the_answer_follows_its_generation_from_pending_to_complete(alice):
    sent = message_send(user=alice, content="Hi")
    generation = generation_claim(generation_id=sent.generation.id, worker="test")
    assert generation is not None
    sent.assistant_message.refresh_from_db()
    assert sent.assistant_message.status == Message.Status.PENDING
    generation_mark_started(generation=generation)
    sent.assistant_message.refresh_from_db()
    assert sent.assistant_message.status == Message.Status.STREAMING
    generation_finish(
        generation_id=sent.generation.id, status="complete", text="Hello!", finish_reason="stop", completion_tokens=3
    )
    sent.assistant_message.refresh_from_db()
    assert sent.assistant_message.status == Message.Status.COMPLETE
    assert sent.assistant_message.content == "Hello!"
    assert sent.assistant_message.token_count == 3


def test_a_generation_is_claimed_and_finished_once(alice):
    sent = message_send(user=alice, content="Hi")
    assert generation_claim(generation_id=sent.generation.id, worker="one") is not None
    assert generation_claim(generation_id=sent.generation.id, worker="two") is None
    assert generation_finish(generation_id=sent.generation.id, status="stopped", text="Hel", finish_reason="abort")
    assert generation_finish(generation_id=sent.generation.id, status="complete", text="Hello") is None
    sent.assistant_message.refresh_from_db()
    assert (sent.assistant_message.status, sent.assistant_message.content) == ("stopped", "Hel")


def test_stopping_a_queued_answer_ends_it_before_any_engine_sees_it(alice):
    sent = message_send(user=alice, content="Hi")
    assert generation_request_stop(generation=sent.generation) is not None
    sent.generation.refresh_from_db()
    assert sent.generation.status == Generation.Status.STOPPED
    assert generation_claim(generation_id=sent.generation.id, worker="late") is None
    sent.assistant_message.refresh_from_db()
    assert sent.assistant_message.status == Message.Status.STOPPED


def test_the_history_goes_into_the_next_prompt(alice):
    first = message_send(user=alice, content="My name is Alice.")
    _finish(first.conversation, text="Nice to meet you, Alice.")
    second = message_send(user=alice, content="What is my name?", conversation_id=first.conversation.id)
    assert not second.conversation_created
    from inference.tokenizers import tokenizer_for

    prompt = tokenizer_for(first.conversation.deployment.model_path).decode(second.generation.prompt_token_ids)
    assert (
        prompt.index("My name is Alice.") < prompt.index("Nice to meet you, Alice.") < prompt.index("What is my name?")
    )


def test_renaming_checks_the_title(alice):
    conversation = message_send(user=alice, content="Hi").conversation
    with pytest.raises(ClientError):
        conversation_rename(conversation=conversation, title="   ")
    assert conversation_rename(conversation=conversation, title="Greetings").title == "Greetings"


def _finish(conversation, text="ok"):
    for message in conversation.messages.filter(status=Message.Status.PENDING):
        generation_finish(generation_id=message.generation_id, status="complete", text=text, finish_reason="stop")


def test_a_failed_answer_can_be_regenerated_into_the_same_message(alice):
    from conversations.services import message_regenerate

    sent = message_send(user=alice, content="Hi")
    generation_finish(generation_id=sent.generation.id, status="failed", text="Hel", error_code="worker_lost")
    answer, generation = message_regenerate(user=alice, message_id=sent.assistant_message.id)
    assert answer.id == sent.assistant_message.id
    assert generation.id != sent.generation.id
    assert generation.prompt_token_ids == sent.generation.prompt_token_ids
    answer.refresh_from_db()
    assert (answer.status, answer.content, answer.generation_id) == ("pending", "", generation.id)
    assert sent.conversation.messages.count() == 2


def test_regenerating_is_refused_for_others_answers_and_answers_in_progress(alice, mallory):
    from conversations.services import message_regenerate

    sent = message_send(user=alice, content="Hi")
    with pytest.raises(ClientError) as in_progress:
        message_regenerate(user=alice, message_id=sent.assistant_message.id)
    assert in_progress.value.code == "generation_in_progress"
    generation_finish(generation_id=sent.generation.id, status="complete", text="Hello")
    for who, message_id in ((mallory, sent.assistant_message.id), (alice, sent.user_message.id), (alice, "1")):
        with pytest.raises(ClientError) as refused:
            message_regenerate(user=who, message_id=message_id)
        assert refused.value.code == "not_found"
