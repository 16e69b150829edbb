from __future__ import annotations

from django.urls import reverse

from conversations.models import Conversation
from conversations.services import message_send
from inference.services import generation_finish


def test_the_chat_page_requires_a_login(client, db):
    response = client.get(reverse("conversations:chat"))
    assert response.status_code == 302
    assert response.url.startswith(reverse("accounts:login"))


def test_the_chat_page_lists_only_my_conversations(client, alice, bob):
    message_send(user=alice, content="Alice asks about tea")
    message_send(user=bob, content="Bob asks about coffee")
    client.force_login(alice)
    page = client.get(reverse("conversations:chat")).content.decode()
    assert "Alice asks about tea" in page
    assert "Bob asks about coffee" not in page


def test_a_conversation_is_there_after_a_reload(client, alice):
    sent = message_send(user=alice, content="What is 2 + 2?")
    generation_finish(generation_id=sent.generation.id, status="complete", text="It is 4.", finish_reason="stop")
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert "What is 2 + 2?" in page and "It is 4." in page


def test_an_answer_in_progress_is_marked_for_the_page_to_resume(client, alice):
    sent = message_send(user=alice, content="Hi")
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert f'data-generation="{sent.generation.id}"' in page
    assert 'data-status="pending"' in page


def test_another_users_conversation_is_a_404(client, alice, mallory):
    sent = message_send(user=alice, content="Private")
    client.force_login(mallory)
    assert client.get(reverse("conversations:conversation", args=[sent.conversation.id])).status_code == 404
    assert client.post(reverse("conversations:delete", args=[sent.conversation.id])).status_code == 404
    assert Conversation.objects.filter(id=sent.conversation.id).exists()


def test_model_and_user_text_is_rendered_inert(client, alice):
    sent = message_send(user=alice, content="<script>alert(1)</script>")
    generation_finish(
        generation_id=sent.generation.id, status="complete", text='<img src=x onerror="alert(2)">', finish_reason="stop"
    )
    client.force_login(alice)
    page = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '<img src=x onerror="alert(2)">' not in page


def test_deleting_my_conversation(client, alice):
    sent = message_send(user=alice, content="Delete me")
    client.force_login(alice)
    assert client.post(reverse("conversations:delete", args=[sent.conversation.id])).status_code == 302
    assert not Conversation.objects.filter(id=sent.conversation.id).exists()
