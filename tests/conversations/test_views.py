from __future__ import annotations

from django.urls import reverse

from conversations.models import Conversation, Message
from conversations.requests import SendRequest
from conversations.services import ANSWER_CUT, HELD_BACK, message_send
from inference.services import generation_finish
from moderation.models import Flag
from moderation.services import SELF_HARM_SUPPORT, InputCheck, Verdict


def test_the_chat_page_requires_a_login(client, db):
    response = client.get(reverse("conversations:chat"))
    assert response.status_code == 302
    assert response.url.startswith(reverse("accounts:login"))


def test_the_chat_page_lists_only_my_conversations(client, alice, bob, django_capture_on_commit_callbacks):
    for user, content in ((alice, "Alice asks about tea"), (bob, "Bob asks about coffee")):
        sent = message_send(user=user, request=SendRequest(content=content))
        with django_capture_on_commit_callbacks(execute=True):  # the title comes once the answer ends
            generation_finish(generation_id=sent.generation.id, status="complete", text="Yes.", finish_reason="stop")
    client.force_login(alice)
    page = client.get(reverse("conversations:chat")).content.decode()
    assert "Alice asks about tea" in page
    assert "Bob asks about coffee" not in page


def test_a_conversation_is_there_after_a_reload(client, alice):
    sent = message_send(user=alice, request=SendRequest(content="What is 2 + 2?"))
    generation_finish(generation_id=sent.generation.id, status="complete", text="It is 4.", finish_reason="stop")
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert "What is 2 + 2?" in page and "It is 4." in page


def test_an_answer_in_progress_is_marked_for_the_page_to_resume(client, alice):
    sent = message_send(user=alice, request=SendRequest(content="Hi"))
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert f'data-generation="{sent.generation.id}"' in page
    assert 'data-status="pending"' in page


def test_another_users_conversation_is_a_404(client, alice, mallory):
    sent = message_send(user=alice, request=SendRequest(content="Private"))
    client.force_login(mallory)
    assert client.get(reverse("conversations:conversation", args=[sent.conversation.id])).status_code == 404
    assert client.post(reverse("conversations:delete", args=[sent.conversation.id])).status_code == 404
    assert Conversation.objects.filter(id=sent.conversation.id).exists()


def test_model_and_user_text_is_rendered_inert(client, alice):
    sent = message_send(user=alice, request=SendRequest(content="<script>alert(1)</script>"))
    generation_finish(
        generation_id=sent.generation.id, status="complete", text='<img src=x onerror="alert(2)">', finish_reason="stop"
    )
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '<img src=x onerror="alert(2)">' not in page


def test_deleting_my_conversation(client, alice):
    sent = message_send(user=alice, request=SendRequest(content="Delete me"))
    client.force_login(alice)
    assert client.post(reverse("conversations:delete", args=[sent.conversation.id])).status_code == 302
    assert not Conversation.objects.filter(id=sent.conversation.id).exists()


def test_a_held_back_message_shows_after_a_reload_the_reason_its_send_gave(client, alice):
    verdict = Verdict(action="block", categories=("self-harm",))
    sent = message_send(
        user=alice, request=SendRequest(content="A message moderation holds back"), check=InputCheck.decided(verdict)
    )
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert sent.blocked
    assert "our policy on self-harm" in page
    assert SELF_HARM_SUPPORT.replace("'", "&#x27;") in page
    assert HELD_BACK.replace("'", "&#x27;") not in page


def test_a_held_back_message_whose_flag_is_gone_says_it_was_held_back(client, alice):
    sent = message_send(
        user=alice,
        request=SendRequest(content="Held back"),
        check=InputCheck.decided(Verdict(action="block", categories=("violence",))),
    )
    Flag.objects.filter(message=sent.user_message).delete()
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert HELD_BACK.replace("'", "&#x27;") in page


def test_an_answer_output_moderation_cut_says_so_and_the_script_gets_the_same_words(client, alice):
    sent = message_send(user=alice, request=SendRequest(content="Tell me a story"))
    generation_finish(
        generation_id=sent.generation.id, status="complete", text="Once upon", finish_reason="content_filter"
    )
    Message.objects.filter(id=sent.assistant_message.id).update(status=Message.Status.FLAGGED)
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert f'<div class="note">{ANSWER_CUT}</div>' in page
    assert f'data-answer-cut-note="{ANSWER_CUT}"' in page
