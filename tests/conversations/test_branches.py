"""A conversation as a tree: edits and regenerations are branches, the prompt is one branch, the
branch shown is stored, a cut answer is continued, and answers take feedback."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.test import Client
from django.urls import reverse

from billing.models import UsageRecord
from chatsite.errors import ClientError
from conversations.models import Conversation, Message, MessageFeedback
from conversations.requests import AnswerRequest, SendRequest
from conversations.selectors import message_branch
from conversations.services import (
    conversation_branch_select,
    message_continue,
    message_feedback_clear,
    message_feedback_set,
    message_regenerate,
    message_send,
)
from inference.engine.tokenizers import continuation_ids, tokenizer_for
from inference.models import Generation
from inference.services import generation_finish
from tests.conversations.test_apis import client_for
from tests.helpers.factories import PASSWORD


def _finish(sent, text, *, finish_reason="stop", completion_tokens=3):
    generation_finish(
        generation_id=sent.generation.id,
        status="complete",
        text=text,
        finish_reason=finish_reason,
        completion_tokens=completion_tokens,
    )


def _prompt_text(generation: Generation) -> str:
    return tokenizer_for(generation.deployment.model_path).decode(generation.prompt_token_ids)


@pytest.fixture
def two_turns(alice):
    """Alice asked two questions, each answered: one branch, m1 a1 m2 a2."""
    first = message_send(user=alice, request=SendRequest(content="Name a colour."))
    _finish(first, "Teal.")
    second = message_send(
        user=alice, request=SendRequest(content="Name a bird.", conversation_id=first.conversation.id)
    )
    _finish(second, "Heron.")
    return first, second


def test_a_message_follows_the_answer_before_it(two_turns):
    first, second = two_turns
    assert first.user_message.parent_id is None
    assert second.user_message.parent_id == first.assistant_message.id
    assert second.assistant_message.parent_id == second.user_message.id


def test_an_edit_is_a_new_branch_beside_the_message_it_edits_and_its_prompt_is_that_branch(alice, two_turns):
    first, second = two_turns
    edit = message_send(
        user=alice,
        request=SendRequest(
            content="Name a fish.", conversation_id=first.conversation.id, parent=first.assistant_message.id
        ),
    )
    assert edit.user_message.parent_id == first.assistant_message.id
    assert edit.siblings == (second.user_message.id, edit.user_message.id)
    prompt = _prompt_text(edit.generation)
    assert "Name a colour." in prompt and "Teal." in prompt and "Name a fish." in prompt
    assert "Name a bird." not in prompt and "Heron." not in prompt
    # The old branch is kept, and the new one is shown.
    assert Message.objects.filter(id__in=[second.user_message.id, second.assistant_message.id]).count() == 2
    branch = message_branch(conversation=Conversation.objects.get(id=first.conversation.id))
    assert [m.content for m in branch.messages] == ["Name a colour.", "Teal.", "Name a fish.", ""]
    assert branch.messages[2].siblings == [second.user_message.id, edit.user_message.id]


def test_an_edit_of_the_first_message_starts_a_branch_from_the_beginning(alice, two_turns):
    first, _ = two_turns
    edit = message_send(
        user=alice, request=SendRequest(content="Name a tree.", conversation_id=first.conversation.id, parent=None)
    )
    assert edit.user_message.parent_id is None
    prompt = _prompt_text(edit.generation)
    assert "Name a tree." in prompt and "Name a colour." not in prompt and "Teal." not in prompt


def test_a_send_without_a_parent_goes_on_from_the_branch_shown(alice, two_turns):
    first, second = two_turns
    edit = message_send(
        user=alice,
        request=SendRequest(
            content="Name a fish.", conversation_id=first.conversation.id, parent=first.assistant_message.id
        ),
    )
    _finish(edit, "Carp.")
    # Back to the first branch: the next message follows its answer, and its prompt is that branch.
    conversation = Conversation.objects.get(id=first.conversation.id)
    assert conversation_branch_select(conversation=conversation, message_id=second.user_message.id) == (
        second.assistant_message.id
    )
    after = message_send(user=alice, request=SendRequest(content="And a tree?", conversation_id=conversation.id))
    assert after.user_message.parent_id == second.assistant_message.id
    prompt = _prompt_text(after.generation)
    assert "Heron." in prompt and "Carp." not in prompt


def test_a_regenerated_answer_is_answered_from_its_own_branch_only(alice, two_turns):
    first, second = two_turns
    edit = message_send(
        user=alice,
        request=SendRequest(
            content="Name a fish.", conversation_id=first.conversation.id, parent=first.assistant_message.id
        ),
    )
    _finish(edit, "Carp.")
    regenerated = message_regenerate(
        user=alice,
        request=AnswerRequest.parse({"message": edit.assistant_message.id, "replaces": str(edit.generation.id)}),
    )
    assert regenerated.answer.parent_id == edit.user_message.id
    assert regenerated.generation.prompt_token_ids == edit.generation.prompt_token_ids
    # The page shows an older answer (1 of 2) and asks again, naming the newest answer it knows of:
    # a third answer, not the second one again.
    _finish(SentLike(regenerated.generation), "Trout.")
    third = message_regenerate(
        user=alice,
        request=AnswerRequest.parse({"message": edit.assistant_message.id, "replaces": str(regenerated.generation.id)}),
    )
    assert not third.replayed
    assert third.siblings == [edit.assistant_message.id, regenerated.answer.id, third.answer.id]


class SentLike:
    def __init__(self, generation):
        self.generation = generation


@pytest.mark.parametrize("parent", ["other conversation", "other user", "a question", "missing"])
def test_a_parent_that_is_not_an_answer_of_this_conversation_is_refused_and_nothing_is_written(
    alice, mallory, two_turns, parent
):
    first, second = two_turns
    elsewhere = message_send(user=alice, request=SendRequest(content="Elsewhere"))
    _finish(elsewhere, "Yes.")
    mallorys = message_send(user=mallory, request=SendRequest(content="Mallory's"))
    _finish(mallorys, "Hm.")
    parent_id = {
        "other conversation": elsewhere.assistant_message.id,
        "other user": mallorys.assistant_message.id,
        "a question": second.user_message.id,
        "missing": 10**12,
    }[parent]
    messages, generations = Message.objects.count(), Generation.objects.count()
    with pytest.raises(ClientError) as refused:
        message_send(
            user=alice, request=SendRequest(content="Hi", conversation_id=first.conversation.id, parent=parent_id)
        )
    assert (refused.value.code, refused.value.status, refused.value.param) == ("invalid_parent", 400, "parent")
    assert (Message.objects.count(), Generation.objects.count()) == (messages, generations)


@pytest.mark.parametrize("parent", ["1", True, 1.5, [1], -3, 10**40])
def test_a_parent_that_is_not_an_id_is_refused(alice, two_turns, parent):
    first, _ = two_turns
    with pytest.raises(ClientError) as refused:
        message_send(
            user=alice, request=SendRequest(content="Hi", conversation_id=first.conversation.id, parent=parent)
        )
    assert (refused.value.code, refused.value.param) == ("invalid_request", "parent")


def test_a_parent_without_a_conversation_is_refused(alice, two_turns):
    first, _ = two_turns
    with pytest.raises(ClientError) as refused:
        message_send(user=alice, request=SendRequest(content="Hi", parent=first.assistant_message.id))
    assert refused.value.code == "invalid_parent"
    assert Conversation.objects.count() == 1


def test_choosing_a_branch_shows_its_newest_leaf_and_is_stored(alice, two_turns):
    first, second = two_turns
    edit = message_send(
        user=alice,
        request=SendRequest(
            content="Name a fish.", conversation_id=first.conversation.id, parent=first.assistant_message.id
        ),
    )
    _finish(edit, "Carp.")
    conversation = Conversation.objects.get(id=first.conversation.id)
    assert message_branch(conversation=conversation).messages[-1].id == edit.assistant_message.id
    conversation_branch_select(conversation=conversation, message_id=second.user_message.id)
    stored = Conversation.objects.get(id=conversation.id)
    assert stored.active_leaf_id == second.assistant_message.id
    assert [m.content for m in message_branch(conversation=stored).messages] == [
        "Name a colour.",
        "Teal.",
        "Name a bird.",
        "Heron.",
    ]


def test_a_branch_is_chosen_only_by_a_message_of_its_conversation(alice, two_turns):
    first, _ = two_turns
    elsewhere = message_send(user=alice, request=SendRequest(content="Elsewhere"))
    conversation = Conversation.objects.get(id=first.conversation.id)
    with pytest.raises(ClientError) as refused:
        conversation_branch_select(conversation=conversation, message_id=elsewhere.user_message.id)
    assert refused.value.code == "invalid_message"
    # What is not a message id at all is refused where the request enters.
    url = reverse("api-conversation-branch", args=[conversation.id])
    for message_id in ("x", True, None, 0):
        assert client_for(alice).post(url, {"message": message_id}, format="json").status_code == 400
    assert Conversation.objects.get(id=conversation.id).active_leaf_id != elsewhere.user_message.id


def test_an_answer_cut_at_its_length_limit_is_continued_in_the_same_message_and_charged(alice):
    sent = message_send(user=alice, request=SendRequest(content="Tell a story."))
    _finish(sent, "Once upon", finish_reason="length", completion_tokens=2)
    continued = message_continue(
        user=alice,
        request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(sent.generation.id)}),
    )
    assert continued.answer.id == sent.assistant_message.id and not continued.replayed
    tokenizer = tokenizer_for(sent.generation.deployment.model_path)
    tail = continuation_ids(tokenizer, "Once upon")
    # The prompt is the question's, followed by the answer so far, so the model writes on from it.
    assert continued.generation.prompt_token_ids == sent.generation.prompt_token_ids + tail
    answer = Message.objects.get(id=sent.assistant_message.id)
    assert (answer.status, answer.content, answer.text_before) == ("pending", "Once upon", "Once upon")
    # Sent again (a dropped socket): the same continuation, nothing queued.
    again = message_continue(
        user=alice,
        request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(sent.generation.id)}),
    )
    assert again.replayed and again.generation.id == continued.generation.id
    generation_finish(
        generation_id=continued.generation.id,
        status="complete",
        text=" a time.",
        finish_reason="stop",
        completion_tokens=3,
    )
    answer.refresh_from_db()
    assert (answer.content, answer.token_count, answer.finish_reason) == ("Once upon a time.", 5, "stop")
    assert Generation.objects.count() == 2
    assert UsageRecord.objects.filter(generation_id=continued.generation.id).count() == 1


def test_an_answer_continued_since_the_client_learnt_of_it_is_regenerated_not_replayed(alice):
    """The page names the answer's first generation, though a continuation writes it now (stopped
    here): that is no newer answer, so a new one is written beside it, whole."""
    sent = message_send(user=alice, request=SendRequest(content="Tell a story."))
    _finish(sent, "Once upon", finish_reason="length", completion_tokens=2)
    continued = message_continue(
        user=alice,
        request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(sent.generation.id)}),
    )
    generation_finish(generation_id=continued.generation.id, status="stopped", text=" a", completion_tokens=1)
    for replaces in (sent.generation.id, continued.generation.id):
        regenerated = message_regenerate(
            user=alice,
            request=AnswerRequest.parse({"message": sent.assistant_message.id, "replaces": str(replaces)}),
        )
        assert not regenerated.replayed and regenerated.answer.id != sent.assistant_message.id
        generation_finish(generation_id=regenerated.generation.id, status="complete", text="Hi.")
        Message.objects.filter(id=regenerated.answer.id).delete()
    assert Message.objects.get(id=sent.assistant_message.id).content == "Once upon a"


def test_only_an_answer_cut_at_its_length_limit_can_be_continued(alice):
    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    _finish(sent, "Hello.")
    with pytest.raises(ClientError) as refused:
        message_continue(user=alice, request=AnswerRequest.parse({"message": sent.assistant_message.id}))
    assert refused.value.code == "not_continuable"
    assert Generation.objects.count() == 1


def test_feedback_is_one_per_user_and_answer_and_is_updated(alice, two_turns):
    first, _ = two_turns
    ids = {"conversation_id": first.conversation.id, "message_id": first.assistant_message.id}
    message_feedback_set(user=alice, rating="up", **ids)
    message_feedback_set(user=alice, rating="down", comment="  Too short.  ", **ids)
    feedback = MessageFeedback.objects.get()
    assert (feedback.rating, feedback.comment, feedback.user, feedback.message_id) == (
        "down",
        "Too short.",
        alice,
        first.assistant_message.id,
    )


def test_feedback_is_only_for_answers_of_ones_own_conversations(alice, mallory, two_turns):
    first, second = two_turns
    cases = [
        (mallory, first.conversation.id, first.assistant_message.id, "up"),  # someone else's
        (alice, first.conversation.id, first.user_message.id, "up"),  # a question
        (alice, first.conversation.id + 1000, first.assistant_message.id, "up"),  # the wrong conversation
    ]
    for user, conversation_id, message_id, rating in cases:
        with pytest.raises(ClientError) as refused:
            message_feedback_set(user=user, conversation_id=conversation_id, message_id=message_id, rating=rating)
        assert refused.value.code == "not_found"
    # A rating or comment that is not one is refused where the request enters, and nothing is saved.
    url = reverse("api-message-feedback", args=[first.conversation.id, first.assistant_message.id])
    for body in ({"rating": "sideways"}, {"rating": "up", "comment": 7}, {"rating": "up", "comment": "x" * 2001}):
        assert client_for(alice).put(url, body, format="json").status_code == 400
    assert not MessageFeedback.objects.exists()


def test_a_rating_is_cleared_by_its_owner_only(alice, mallory, two_turns):
    first, second = two_turns
    ids = {"conversation_id": first.conversation.id, "message_id": first.assistant_message.id}
    message_feedback_set(user=alice, rating="up", **ids)
    message_feedback_set(
        user=alice, rating="down", message_id=second.assistant_message.id, conversation_id=ids["conversation_id"]
    )
    with pytest.raises(ClientError) as refused:
        message_feedback_clear(user=mallory, **ids)
    assert refused.value.code == "not_found"
    assert MessageFeedback.objects.count() == 2
    message_feedback_clear(user=alice, **ids)
    message_feedback_clear(user=alice, **ids)  # cleared already: nothing to do, and no error
    assert list(MessageFeedback.objects.values_list("message_id", "rating")) == [(second.assistant_message.id, "down")]


def test_staff_read_feedback_in_the_admin_filtered_by_rating_and_model(alice, two_turns, make_user):
    first, second = two_turns
    ids = {"conversation_id": first.conversation.id}
    message_feedback_set(
        user=alice, rating="down", comment="Wrong colour", message_id=first.assistant_message.id, **ids
    )
    message_feedback_set(user=alice, rating="up", comment="Nice bird", message_id=second.assistant_message.id, **ids)
    admin = make_user("olivia")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    client = Client()
    assert client.login(username="olivia", password=PASSWORD)
    page = client.get("/admin/conversations/messagefeedback/", {"rating__exact": "down"})
    assert page.status_code == 200
    assert b"Wrong colour" in page.content and b"Nice bird" not in page.content
    deployment = first.conversation.deployment
    by_model = client.get(
        "/admin/conversations/messagefeedback/", {"message__conversation__deployment__id__exact": deployment.id}
    )
    assert b"Wrong colour" in by_model.content and b"Nice bird" in by_model.content
    # Users are not staff: the admin is closed to them.
    assert client_for(alice).get("/admin/conversations/messagefeedback/").status_code == 302


def test_the_migration_chains_the_messages_of_a_conversation_written_before_branches(alice):
    migration = __import__(
        "conversations.migrations.0005_message_tree_and_feedback", fromlist=["user_messages_chained"]
    )
    sent = message_send(user=alice, request=SendRequest(content="Old question"))
    _finish(sent, "Old answer")
    later = message_send(user=alice, request=SendRequest(content="Old follow-up", conversation_id=sent.conversation.id))
    Message.objects.filter(role="user").update(parent=None)  # as they were saved before branches
    migration.user_messages_chained(apps, None)
    assert Message.objects.get(id=later.user_message.id).parent_id == sent.assistant_message.id
    assert Message.objects.get(id=sent.user_message.id).parent_id is None
    branch = message_branch(conversation=Conversation.objects.get(id=sent.conversation.id))
    assert [m.content for m in branch.messages] == ["Old question", "Old answer", "Old follow-up", ""]


# --- the API ---------------------------------------------------------------------------------------


def test_the_api_returns_a_branch_with_parents_and_siblings_and_reads_another_by_a_message(alice, two_turns):
    first, second = two_turns
    edit = message_send(
        user=alice,
        request=SendRequest(
            content="Name a fish.", conversation_id=first.conversation.id, parent=first.assistant_message.id
        ),
    )
    _finish(edit, "Carp.")
    client = client_for(alice)
    url = f"/api/conversations/{first.conversation.id}/"
    body = client.get(url).json()
    assert [(m["content"], m["parent"]) for m in body["messages"]] == [
        ("Name a colour.", None),
        ("Teal.", first.user_message.id),
        ("Name a fish.", first.assistant_message.id),
        ("Carp.", edit.user_message.id),
    ]
    assert body["messages"][2]["siblings"] == [second.user_message.id, edit.user_message.id]
    older = client.get(url, {"branch": second.user_message.id}).json()
    assert [m["content"] for m in older["messages"]][2:] == ["Name a bird.", "Heron."]
    for bad in (
        "abc",
        "-1",
        str(10**40),
        str(message_send(user=alice, request=SendRequest(content="Other")).user_message.id),
    ):
        assert client.get(url, {"branch": bad}).status_code == 400


def test_the_api_chooses_the_branch_shown(alice, mallory, two_turns):
    first, second = two_turns
    message_send(
        user=alice,
        request=SendRequest(
            content="Name a fish.", conversation_id=first.conversation.id, parent=first.assistant_message.id
        ),
    )
    url = f"/api/conversations/{first.conversation.id}/branch/"
    response = client_for(alice).post(url, {"message": second.user_message.id}, format="json")
    assert response.status_code == 200
    assert response.json()["messages"][-1]["id"] == second.assistant_message.id
    assert Conversation.objects.get(id=first.conversation.id).active_leaf_id == second.assistant_message.id
    assert client_for(mallory).post(url, {"message": second.user_message.id}, format="json").status_code == 404
    assert client_for(alice).post(url, {"message": "x"}, format="json").status_code == 400
    assert client_for(alice, scopes=["conversations:read"]).post(url, {"message": 1}, format="json").status_code == 403


def test_the_api_sends_from_a_parent_and_refuses_one_of_another_conversation(alice, mallory, two_turns):
    first, second = two_turns
    mallorys = message_send(user=mallory, request=SendRequest(content="Mallory's"))
    url = f"/api/conversations/{first.conversation.id}/messages/"
    messages = Message.objects.count()
    for parent in (mallorys.assistant_message.id, second.user_message.id, "x"):
        response = client_for(alice).post(url, {"content": "Hi", "parent": parent}, format="json")
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "parent"
    assert Message.objects.count() == messages


def test_the_api_takes_feedback_on_ones_own_answers(alice, mallory, two_turns):
    first, _ = two_turns
    url = f"/api/conversations/{first.conversation.id}/messages/{first.assistant_message.id}/feedback/"
    response = client_for(alice).put(url, {"rating": "down", "comment": "Too short."}, format="json")
    assert response.status_code == 200
    assert response.json()["rating"] == "down" and response.json()["comment"] == "Too short."
    assert client_for(alice).put(url, {"rating": "meh"}, format="json").status_code == 400
    assert client_for(mallory).put(url, {"rating": "up"}, format="json").status_code == 404
    assert MessageFeedback.objects.get().rating == "down"


def test_the_api_clears_a_rating_on_ones_own_answers_only(alice, mallory, two_turns):
    first, _ = two_turns
    url = f"/api/conversations/{first.conversation.id}/messages/{first.assistant_message.id}/feedback/"
    assert client_for(alice).put(url, {"rating": "up"}, format="json").status_code == 200
    assert client_for(mallory).delete(url).status_code == 404
    assert MessageFeedback.objects.exists()
    question = f"/api/conversations/{first.conversation.id}/messages/{first.user_message.id}/feedback/"
    assert client_for(alice).delete(question).status_code == 404
    assert client_for(alice).delete(url).status_code == 204
    assert not MessageFeedback.objects.exists()
    assert client_for(alice).delete(url).status_code == 204
