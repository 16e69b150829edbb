from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Tier, UserSettings
from chatsite.errors import ClientError
from conversations.models import Conversation, Message
from conversations.requests import AnswerRequest, SendRequest
from conversations.services import conversation_rename, message_send
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.models import Generation, ModelDeployment
from inference.services import generation_claim, generation_finish, generation_mark_started, generation_request_stop
from tests.helpers.databases import at_the_same_instant


@pytest.mark.topology
def test_sending_a_first_message_creates_the_conversation_and_a_pending_answer(alice):
    sent = message_send(user=alice, request=SendRequest(content="  Hello there  "))
    assert sent.conversation_created
    assert sent.conversation.user == alice
    assert sent.conversation.title == ""  # written once an answer has ended (test_titles.py)
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


@pytest.mark.topology
def test_a_first_message_reads_its_queue_with_its_model_and_opens_no_savepoint(alice):
    # Each statement is a round trip on the way to the first token: the queue's length comes with
    # the model's row, and only a blocked message rolls back (in full), so none needs a savepoint.
    message_send(user=alice, request=SendRequest(content="warm the caches"))
    with CaptureQueriesContext(connection) as send:
        message_send(user=alice, request=SendRequest(content="Hello there"))
    statements = [q["sql"].lstrip() for q in send.captured_queries]
    verbs = [sql.split()[0].upper() for sql in statements]
    # The one savepoint is the send's own transaction, nested in the test's.
    assert (verbs.count("SAVEPOINT"), verbs.count("RELEASE")) == (1, 1)
    counts = [sql for sql in statements if "COUNT(" in sql.upper()]
    assert len(counts) == 1 and '"inference_modeldeployment"' in counts[0]


@pytest.mark.topology
def test_a_message_into_a_conversation_reads_and_locks_it_with_its_queue_in_one_statement(alice):
    first = message_send(user=alice, request=SendRequest(content="Hello there"))
    _finish(first.conversation)
    with CaptureQueriesContext(connection) as send:
        message_send(user=alice, request=SendRequest(content="And again", conversation_id=first.conversation.id))
    statements = [q["sql"] for q in send.captured_queries]
    # The search of the person's files (before the transaction) joins the conversation only to find
    # its project's files; the conversation itself is read, and locked, once.
    reads = [
        sql
        for sql in statements
        if '"conversations_conversation"' in sql
        and sql.lstrip().startswith("SELECT")
        and not sql.lstrip().startswith('SELECT "documents_document"')
    ]
    assert len(reads) == 1
    if connection.vendor == "postgresql":
        assert reads[0].rstrip().endswith('FOR UPDATE OF "conversations_conversation"')
    counts = [sql for sql in statements if "COUNT(" in sql.upper()]
    assert counts == reads  # the queue's length read with the conversation's deployment


@pytest.mark.topology
def test_a_message_into_a_conversation_reads_none_of_its_earlier_prompts(alice):
    # Every generation holds its whole prompt's token ids: reading them to place a message would
    # read the conversation again for each answer in it, more with every turn.
    first = message_send(user=alice, request=SendRequest(content="Hello there"))
    _finish(first.conversation)
    for text in ("And again", "Once more"):
        message_send(user=alice, request=SendRequest(content=text, conversation_id=first.conversation.id))
        _finish(first.conversation)
    with CaptureQueriesContext(connection) as send:
        sent = message_send(
            user=alice, request=SendRequest(content="And the last", conversation_id=first.conversation.id)
        )
    reads = [q["sql"] for q in send.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    assert not [sql for sql in reads if "prompt_token_ids" in sql]
    # The prompt still holds the whole branch: the three turns before it and their answers.
    generation = Generation.objects.get(id=sent.generation.id)
    assert len(generation.prompt_token_ids) > len(first.generation.prompt_token_ids) + 20
    assert Message.objects.filter(conversation=first.conversation).count() == 8


@pytest.mark.parametrize("content", ["", "   ", None, 42, "a\x00b", "x" * 40_000])
def test_bad_messages_are_refused_and_leave_nothing_behind(alice, content):
    with pytest.raises(ClientError):
        message_send(user=alice, request=SendRequest(content=content))
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()
    assert not Generation.objects.exists()


def test_a_message_too_long_for_the_window_leaves_nothing_behind(alice):
    Tier.objects.filter(name="free").update(max_context=2048)  # a plan's cap: one message can fill it
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content=" ".join(["overflow"] * 2500)))
    assert refused.value.code == "context_length_exceeded"
    assert not Message.objects.exists()


@pytest.mark.topology
def test_it_refuses_another_users_conversation(alice, bob):
    bobs = message_send(user=bob, request=SendRequest(content="Bob's secret")).conversation
    _finish(bobs)
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="Let me in", conversation_id=bobs.id))
    assert refused.value.code == "not_found"
    assert bobs.messages.count() == 2


@pytest.mark.topology
def test_a_new_message_moves_its_conversation_to_the_top_of_the_list(alice):
    older = message_send(user=alice, request=SendRequest(content="First conversation")).conversation
    _finish(older)
    newer = message_send(user=alice, request=SendRequest(content="Second conversation")).conversation
    _finish(newer)
    assert list(Conversation.objects.filter(user=alice)) == [newer, older]
    message_send(user=alice, request=SendRequest(content="Back to the first", conversation_id=older.id))
    assert list(Conversation.objects.filter(user=alice)) == [older, newer]


@pytest.mark.topology
def test_a_second_message_waits_for_the_answer_in_progress(alice):
    sent = message_send(user=alice, request=SendRequest(content="First"))
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="Second", conversation_id=sent.conversation.id))
    assert refused.value.code == "generation_in_progress"
    assert sent.conversation.messages.count() == 2


@pytest.mark.topology
def test_the_answer_follows_its_generation_from_pending_to_complete(alice):
    sent = message_send(user=alice, request=SendRequest(content="Hi"))
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


@pytest.mark.topology
def test_a_generation_is_claimed_and_finished_once(alice):
    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    assert generation_claim(generation_id=sent.generation.id, worker="one") is not None
    assert generation_claim(generation_id=sent.generation.id, worker="two") is None
    assert generation_finish(generation_id=sent.generation.id, status="stopped", text="Hel", finish_reason="abort")
    assert generation_finish(generation_id=sent.generation.id, status="complete", text="Hello") is None
    sent.assistant_message.refresh_from_db()
    assert (sent.assistant_message.status, sent.assistant_message.content) == ("stopped", "Hel")


@pytest.mark.topology
def test_stopping_a_queued_answer_ends_it_before_any_engine_sees_it(alice):
    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    assert generation_request_stop(generation=sent.generation) is not None
    sent.generation.refresh_from_db()
    assert sent.generation.status == Generation.Status.STOPPED
    assert generation_claim(generation_id=sent.generation.id, worker="late") is None
    sent.assistant_message.refresh_from_db()
    assert sent.assistant_message.status == Message.Status.STOPPED


@pytest.mark.topology
def test_the_history_goes_into_the_next_prompt(alice):
    first = message_send(user=alice, request=SendRequest(content="My name is Alice."))
    _finish(first.conversation, text="Nice to meet you, Alice.")
    second = message_send(
        user=alice, request=SendRequest(content="What is my name?", conversation_id=first.conversation.id)
    )
    assert not second.conversation_created
    from inference.engine.tokenizers import tokenizer_for

    prompt = tokenizer_for(first.conversation.deployment.model_path).decode(second.generation.prompt_token_ids)
    assert (
        prompt.index("My name is Alice.") < prompt.index("Nice to meet you, Alice.") < prompt.index("What is my name?")
    )


@pytest.mark.topology
def test_renaming_checks_the_title(alice):
    conversation = message_send(user=alice, request=SendRequest(content="Hi")).conversation
    with pytest.raises(ClientError):
        conversation_rename(conversation=conversation, title="   ")
    assert conversation_rename(conversation=conversation, title="Greetings").title == "Greetings"


def _finish(conversation, text="ok"):
    for message in conversation.messages.filter(status=Message.Status.PENDING):
        generation_finish(generation_id=message.generation_id, status="complete", text=text, finish_reason="stop")


@pytest.mark.topology
def test_a_failed_answer_is_regenerated_as_a_new_answer_beside_it(alice):
    from conversations.services import message_regenerate

    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    generation_finish(generation_id=sent.generation.id, status="failed", text="Hel", error_code="worker_lost")
    regenerated = message_regenerate(user=alice, request=AnswerRequest.parse({"message": sent.assistant_message.id}))
    answer, generation = regenerated.answer, regenerated.generation
    assert answer.id != sent.assistant_message.id and not regenerated.replayed
    assert generation.id != sent.generation.id
    assert generation.prompt_token_ids == sent.generation.prompt_token_ids
    answer.refresh_from_db()
    assert (answer.status, answer.content, answer.generation_id) == ("pending", "", generation.id)
    assert answer.parent_id == sent.user_message.id
    assert regenerated.siblings == [sent.assistant_message.id, answer.id]
    # The old answer is kept as it ended, one branch of two; the new one is the branch shown.
    old = Message.objects.get(id=sent.assistant_message.id)
    assert (old.status, old.content, old.generation_id) == ("failed", "Hel", sent.generation.id)
    assert sent.conversation.messages.count() == 3
    assert Conversation.objects.get(id=sent.conversation.id).active_leaf_id == answer.id


@pytest.mark.topology
def test_regenerating_is_refused_for_others_answers_and_answers_in_progress(alice, mallory):
    from conversations.services import message_regenerate

    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    with pytest.raises(ClientError) as in_progress:
        message_regenerate(user=alice, request=AnswerRequest.parse({"message": sent.assistant_message.id}))
    assert in_progress.value.code == "generation_in_progress"
    generation_finish(generation_id=sent.generation.id, status="complete", text="Hello")
    for who, message_id in ((mallory, sent.assistant_message.id), (alice, sent.user_message.id), (alice, "1")):
        with pytest.raises(ClientError) as refused:
            message_regenerate(user=who, request=AnswerRequest.parse({"message": message_id}))
        assert refused.value.code == "not_found"


@pytest.mark.topology
def test_a_regenerate_sent_again_is_answered_with_the_answer_it_began(alice):
    from conversations.services import message_regenerate

    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    generation_finish(generation_id=sent.generation.id, status="failed", text="", error_code="worker_lost")
    first = message_regenerate(
        user=alice,
        request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(sent.generation.id)}),
    )
    # The same request again (its socket dropped before the answer): while the new answer is written,
    # and after it has ended.
    again = message_regenerate(
        user=alice,
        request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(sent.generation.id)}),
    )
    generation_finish(generation_id=first.generation.id, status="complete", text="Hello")
    later = message_regenerate(
        user=alice,
        request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(sent.generation.id)}),
    )
    assert not first.replayed and again.replayed and later.replayed
    assert again.generation.id == later.generation.id == first.generation.id
    assert Generation.objects.count() == 2
    # Asked of the answer now shown, it regenerates.
    fresh = message_regenerate(
        user=alice,
        request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(first.generation.id)}),
    )
    assert not fresh.replayed and fresh.generation.id not in (sent.generation.id, first.generation.id)
    assert Generation.objects.count() == 3


@pytest.mark.parametrize("replaces", ["not-a-uuid", 7, ["x"]])
@pytest.mark.topology
def test_a_regenerate_with_a_bad_replaces_is_refused_and_queues_nothing(alice, replaces):
    from conversations.services import message_regenerate

    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    generation_finish(generation_id=sent.generation.id, status="complete", text="Hello")
    with pytest.raises(ClientError) as refused:
        message_regenerate(
            user=alice, request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": replaces})
        )
    assert (refused.value.code, refused.value.param) == ("invalid_request", "replaces")
    assert Generation.objects.count() == 1
    assert Message.objects.get(id=sent.assistant_message.id).generation_id == sent.generation.id


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
def test_two_tabs_regenerating_at_once_get_one_new_answer(alice):
    from conversations.services import message_regenerate

    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    generation_finish(generation_id=sent.generation.id, status="complete", text="Hello")
    results = at_the_same_instant(
        lambda: message_regenerate(
            user=alice,
            request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(sent.generation.id)}),
        ),
        times=2,
    )
    assert sorted(r.replayed for r in results) == [False, True]
    assert results[0].generation.id == results[1].generation.id
    assert Generation.objects.count() == 2


# --- a message sent twice (its client_id) -----------------------------------------------------------

CLIENT_ID = "0b8f3c3e-8d7a-4f57-9a5e-3f1c2b7d9e10"


@pytest.mark.parametrize("retry", [True, False])
@pytest.mark.topology
def test_a_message_sent_twice_is_saved_and_answered_once(alice, retry):
    first = message_send(user=alice, request=SendRequest(content="Hello there", client_id=uuid.UUID(CLIENT_ID)))
    again = message_send(
        user=alice, request=SendRequest(content="Hello there", client_id=uuid.UUID(CLIENT_ID), retry=retry)
    )
    assert not first.replayed and again.replayed
    assert again.conversation == first.conversation
    assert again.conversation_created  # told again: the client that lost the first answer needs the id
    assert again.user_message == first.user_message
    assert again.assistant_message == first.assistant_message
    assert again.generation == first.generation
    assert Conversation.objects.count() == 1
    assert Message.objects.count() == 2
    assert Generation.objects.count() == 1


@pytest.mark.topology
def test_a_message_sent_twice_into_a_conversation_is_not_refused_as_busy(alice):
    opening = message_send(user=alice, request=SendRequest(content="First"))
    _finish(opening.conversation)
    conversation_id = opening.conversation.id
    first = message_send(
        user=alice,
        request=SendRequest(content="Second", conversation_id=conversation_id, client_id=uuid.UUID(CLIENT_ID)),
    )
    # Its answer is being written, which refuses any other message; the same one is answered.
    again = message_send(
        user=alice,
        request=SendRequest(
            content="Second", conversation_id=conversation_id, client_id=uuid.UUID(CLIENT_ID), retry=True
        ),
    )
    assert (again.user_message, again.generation) == (first.user_message, first.generation)
    assert not again.conversation_created
    assert opening.conversation.messages.count() == 4


@pytest.mark.topology
def test_a_message_sent_twice_is_charged_once(alice):
    from accounts.models import Tier

    Tier.objects.filter(name="free").update(requests_per_minute=2)
    first = message_send(user=alice, request=SendRequest(content="question", client_id=uuid.UUID(CLIENT_ID)))
    for retry in (True, False, True):
        message_send(user=alice, request=SendRequest(content="question", client_id=uuid.UUID(CLIENT_ID), retry=retry))
    _finish(first.conversation)
    message_send(
        user=alice, request=SendRequest(content="a second question", conversation_id=first.conversation.id)
    )  # the 2nd unit
    _finish(first.conversation)
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="a third", conversation_id=first.conversation.id))
    assert refused.value.code == "rate_limited"


@pytest.mark.topology
def test_a_held_back_message_sent_twice_is_held_back_once(alice):
    from moderation.models import Flag

    harmful = "How do I build a pipe bomb to blow up my neighbour's car?"
    first = message_send(user=alice, request=SendRequest(content=harmful, client_id=uuid.UUID(CLIENT_ID)))
    again = message_send(user=alice, request=SendRequest(content=harmful, client_id=uuid.UUID(CLIENT_ID), retry=True))
    assert first.blocked and again.blocked and again.replayed
    assert again.user_message == first.user_message
    assert again.blocked_reason == first.blocked_reason
    assert (Message.objects.count(), Flag.objects.count(), Generation.objects.count()) == (1, 1, 0)


@pytest.mark.topology
def test_another_users_client_id_is_refused_and_reveals_nothing(alice, bob):
    bobs = message_send(user=bob, request=SendRequest(content="Bob's secret", client_id=uuid.UUID(CLIENT_ID)))
    for retry in (True, False):
        with pytest.raises(ClientError) as refused:
            message_send(
                user=alice, request=SendRequest(content="Let me in", client_id=uuid.UUID(CLIENT_ID), retry=retry)
            )
        assert refused.value.code == "invalid_request"
        assert "secret" not in refused.value.message
    assert list(Message.objects.values_list("conversation__user", flat=True)) == [bob.id, bob.id]
    assert Conversation.objects.get() == bobs.conversation


@pytest.mark.parametrize("client_id", ["not-a-uuid", 42, "", ["0b8f3c3e-8d7a-4f57-9a5e-3f1c2b7d9e10"]])
def test_a_malformed_client_id_is_refused_and_leaves_nothing_behind(alice, client_id):
    with pytest.raises(ClientError) as refused:
        SendRequest.parse({"content": "Hello", "client_id": client_id})
    assert refused.value.code == "invalid_request"
    assert not Conversation.objects.exists() and not Message.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
def test_one_message_sent_twice_at_the_same_instant_is_saved_once(alice):
    """Two sends of one client_id race (a retry on a new socket while the first socket's send is
    still being saved): the unique constraint makes the second wait for the first, then answer with it."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite takes one writer at a time; the race is PostgreSQL's (the production topology run)")
    sent = at_the_same_instant(
        lambda: message_send(user=alice, request=SendRequest(content="At once", client_id=uuid.UUID(CLIENT_ID))),
        times=4,
    )
    assert len({s.user_message.id for s in sent}) == 1
    assert len({s.generation.id for s in sent}) == 1
    assert sum(not s.replayed for s in sent) == 1
    assert (Conversation.objects.count(), Message.objects.count(), Generation.objects.count()) == (1, 2, 1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.topology
def test_messages_sent_into_one_conversation_at_the_same_instant_get_one_answer(alice):
    """Sends into one conversation wait for each other's lock, and each then sees the answer the one
    before it queued: one is answered, the others are told an answer is being written."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite takes one writer at a time; the race is PostgreSQL's (the production topology run)")
    first = message_send(user=alice, request=SendRequest(content="Hello there"))
    _finish(first.conversation)

    def send():
        try:
            return message_send(
                user=alice, request=SendRequest(content="At once", conversation_id=first.conversation.id)
            )
        except ClientError as refused:
            return refused.code

    outcomes = at_the_same_instant(send, times=4)
    assert sorted(o if isinstance(o, str) else "sent" for o in outcomes) == ["generation_in_progress"] * 3 + ["sent"]
    assert Generation.objects.count() == 2
    assert first.conversation.messages.count() == 4


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_a_regenerate_naming_its_answer_by_anything_but_its_id_finds_nothing(alice):
    from conversations.services import conversation_create, message_regenerate

    answer = Message.objects.create(
        conversation=conversation_create(user=alice, title="Plans"), role=Message.Role.ASSISTANT, content="Hello."
    )
    assert answer.id == 1  # so that True, which Python counts as 1, would name it
    for message_id in (True, 1.0, "1", [1], 10**40, -(10**40)):
        with pytest.raises(ClientError) as refused:
            message_regenerate(user=alice, request=AnswerRequest.parse({"message": message_id}))
        assert refused.value.code == "not_found"
    assert not Generation.objects.exists()


# --- the person's settings in a send ---------------------------------------------------------------


@pytest.fixture
def second_model(db):
    from accounts.models import Tier

    deployment = ModelDeployment.objects.create(name="smollm2-second", **DEFAULT_DEPLOYMENT_FIELDS)
    Tier.objects.get(name="free").deployments.add(deployment)
    return deployment


def _prompt_text(generation) -> str:
    from inference.engine.tokenizers import tokenizer_for

    return tokenizer_for(generation.deployment.model_path).decode(generation.prompt_token_ids)


@pytest.mark.topology
def test_custom_instructions_go_into_the_prompt_of_the_persons_own_chats_only(alice, bob):
    UserSettings.objects.create(user=alice, about_me="I keep bees.", answer_style="Answer in one sentence.")
    alices = message_send(user=alice, request=SendRequest(content="What should I plant?"))
    system_turn = _prompt_text(alices.generation).split("<|im_end|>")[0]
    assert "I keep bees." in system_turn and "Answer in one sentence." in system_turn
    assert "bees" not in _prompt_text(
        message_send(user=bob, request=SendRequest(content="What should I plant?")).generation
    )


@pytest.mark.topology
def test_a_new_chat_without_a_model_starts_on_the_persons_default(alice, second_model):
    UserSettings.objects.create(user=alice, default_model="smollm2-second")
    assert message_send(user=alice, request=SendRequest(content="Hi")).conversation.deployment == second_model
    assert message_send(
        user=alice, request=SendRequest(content="Hi", model=settings.INFERENCE_DEFAULT_DEPLOYMENT)
    ).conversation.deployment.name == (settings.INFERENCE_DEFAULT_DEPLOYMENT)


@pytest.mark.topology
def test_a_send_with_another_model_moves_the_conversation_to_it_from_that_message_on(alice, second_model):
    first = message_send(user=alice, request=SendRequest(content="Hello there"))
    _finish(first.conversation)
    second = message_send(
        user=alice,
        request=SendRequest(content="And again", conversation_id=first.conversation.id, model="smollm2-second"),
    )
    assert second.generation.deployment == second_model
    assert first.generation.deployment.name == settings.INFERENCE_DEFAULT_DEPLOYMENT  # the earlier answer stays its
    assert Conversation.objects.get(id=first.conversation.id).deployment == second_model


@pytest.mark.topology
def test_a_switch_to_a_model_outside_the_plan_is_refused_and_changes_nothing(alice):
    outside = ModelDeployment.objects.create(name="smollm2-pro-only", **DEFAULT_DEPLOYMENT_FIELDS)
    first = message_send(user=alice, request=SendRequest(content="Hello there"))
    _finish(first.conversation)
    with pytest.raises(ClientError) as refused:
        message_send(
            user=alice,
            request=SendRequest(content="And again", conversation_id=first.conversation.id, model=outside.name),
        )
    assert refused.value.code == "model_not_allowed"
    assert Conversation.objects.get(id=first.conversation.id).deployment.name == settings.INFERENCE_DEFAULT_DEPLOYMENT
    assert first.conversation.messages.count() == 2


# --- regenerating with another model --------------------------------------------------------------


@pytest.mark.topology
def test_an_answer_is_regenerated_by_another_model_and_the_conversation_stays_on_its_own(alice, second_model):
    from conversations.services import message_regenerate

    sent = message_send(user=alice, request=SendRequest(content="Hello there"))
    _finish(sent.conversation)
    again = message_regenerate(
        user=alice, request=AnswerRequest(message_id=sent.assistant_message.id, model="smollm2-second")
    )
    assert again.generation.deployment == second_model
    assert again.answer.parent_id == sent.user_message.id and again.answer.id != sent.assistant_message.id
    conversation = Conversation.objects.get(id=sent.conversation.id)
    assert conversation.deployment.name == settings.INFERENCE_DEFAULT_DEPLOYMENT and conversation.model_name == ""
    # A plain regenerate asks the conversation's model again.
    _finish(conversation)
    plain = message_regenerate(user=alice, request=AnswerRequest(message_id=again.answer.id))
    assert plain.generation.deployment.name == settings.INFERENCE_DEFAULT_DEPLOYMENT


@pytest.mark.topology
def test_a_regenerate_with_a_model_outside_the_plan_is_refused_as_a_send_is_and_queues_nothing(alice):
    from conversations.services import message_regenerate

    outside = ModelDeployment.objects.create(name="smollm2-pro-only", **DEFAULT_DEPLOYMENT_FIELDS)
    sent = message_send(user=alice, request=SendRequest(content="Hello there"))
    _finish(sent.conversation)
    with pytest.raises(ClientError) as by_send:
        message_send(
            user=alice,
            request=SendRequest(content="Again", conversation_id=sent.conversation.id, model=outside.name),
        )
    with pytest.raises(ClientError) as by_regenerate:
        message_regenerate(user=alice, request=AnswerRequest(message_id=sent.assistant_message.id, model=outside.name))
    assert (by_regenerate.value.code, by_regenerate.value.status, by_regenerate.value.message) == (
        by_send.value.code,
        by_send.value.status,
        by_send.value.message,
    )
    assert by_regenerate.value.code == "model_not_allowed"
    assert Generation.objects.count() == 1 and sent.conversation.messages.count() == 2


@pytest.mark.parametrize(
    ("frame", "with_model", "code"),
    [
        ({"message": 1, "model": 7}, True, "invalid_request"),
        ({"message": 1, "model": "x" * 101}, True, "invalid_request"),
        ({"message": 1, "model": "smollm2-second"}, False, "invalid_request"),  # a continue names no model
    ],
)
def test_an_answer_requests_model_is_checked_where_it_enters(frame, with_model, code):
    with pytest.raises(ClientError) as refused:
        AnswerRequest.parse(frame, with_model=with_model)
    assert refused.value.code == code and refused.value.param == "model"


@pytest.mark.topology
def test_a_message_into_a_conversation_takes_a_known_number_of_statements(alice):
    # Every send pays each of these on the web process before its answer starts: a new one must be
    # worth its round trip. The plan's tier, the search of the person's files, the send's savepoint,
    # the conversation (locked, with its queue), whether it is answering, the branch's leaf, the tier
    # with its model list, the person's settings, the message, the reserved tokens, the quota's
    # periods (one sum for all), the generation, the answer, the conversation's leaf, the release.
    Tier.objects.filter(name="free").update(tokens_per_day=1_000_000, tokens_per_month=10_000_000)
    first = message_send(user=alice, request=SendRequest(content="Hello there"))
    _finish(first.conversation)
    request = SendRequest(content="And again", conversation_id=first.conversation.id, client_id=uuid.uuid4())
    with CaptureQueriesContext(connection) as send:
        message_send(user=alice, request=request)
    assert len(send.captured_queries) == 15, "\n".join(q["sql"][:120] for q in send.captured_queries)
