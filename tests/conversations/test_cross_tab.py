"""The user's other tabs: a message sent in one appears in the others, which follow its answer, and
a conversation's title reaches every one of them; another user's sockets hear none of it."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from conversations.models import Conversation, Message
from conversations.services import conversation_archive, conversation_create, conversation_rename
from tests.helpers.sockets import ENGINE_STATUS, drain_until_finished, events_but_broadcasts, next_event, open_socket

pytestmark = [pytest.mark.topology, pytest.mark.django_db(transaction=True)]


async def _quiet(socket, *, for_s: float = 0.5) -> bool:
    """Whether the socket hears nothing for a while but the engine's state (a worker starting elsewhere
    in the run says it to every socket), without ending it, as a receive that times out would."""
    return await events_but_broadcasts(socket, timeout=for_s, skipping=ENGINE_STATUS) == []


async def test_a_message_sent_in_one_tab_appears_in_the_other_which_follows_its_answer(engine, alice, bob):
    sender, _ = await open_socket(alice)
    other_tab, _ = await open_socket(alice)
    bobs, _ = await open_socket(bob)
    await sender.send_json_to({"type": "message.send", "content": "Name a colour."})
    sent = await drain_until_finished(sender)
    accepted = next(e for e in sent if e["type"] == "message.accepted")

    told = await next_event(other_tab, skipping=("engine.status", "conversation.title"))
    assert told == {
        "type": "conversation.message",
        "conversation": {"id": accepted["conversation"], "title": "New chat", "archived": False},
        "created": True,
        "user_message": {
            "id": accepted["user_message"]["id"],
            "content": "Name a colour.",
            "parent": None,
            "siblings": [accepted["user_message"]["id"]],
        },
        "assistant_message": {"id": accepted["assistant_message"]["id"]},
        "generation": accepted["generation"],
    }
    # The other tab follows the answer from its start, as the page does on hearing of it.
    await other_tab.send_json_to({"type": "generation.resume", "generation": told["generation"], "after_seq": 0})
    followed = await drain_until_finished(other_tab)
    assert followed[-1]["type"] == "generation.done"
    answer = await Message.objects.aget(id=accepted["assistant_message"]["id"])
    assert "".join(e.get("text", "") for e in followed if e["type"] == "generation.delta") == answer.content

    assert await _quiet(bobs)  # another user's socket hears nothing of it
    for socket in (sender, other_tab, bobs):
        await socket.disconnect()


async def test_a_message_sent_in_an_archived_chat_leaves_it_archived_and_other_tabs_know(engine, alice):
    conversation = await database_sync_to_async(conversation_create)(user=alice, title="Kept aside")
    await database_sync_to_async(conversation_archive)(user=alice, conversation_id=conversation.id)
    sender, _ = await open_socket(alice)
    other_tab, _ = await open_socket(alice)
    await sender.send_json_to({"type": "message.send", "content": "Still there?", "conversation": conversation.id})
    sent = await drain_until_finished(sender)
    assert sent[-1]["type"] == "generation.done"
    told = await next_event(other_tab, skipping=("engine.status", "conversation.title"))
    assert told["type"] == "conversation.message"
    assert told["conversation"] == {"id": conversation.id, "title": "Kept aside", "archived": True}
    assert (await Conversation.objects.aget(id=conversation.id)).is_archived
    for socket in (sender, other_tab):
        await socket.disconnect()


async def test_the_sender_is_not_told_twice_and_a_title_reaches_every_tab(engine, alice, bob):
    sender, _ = await open_socket(alice)
    other_tab, _ = await open_socket(alice)
    bobs, _ = await open_socket(bob)
    await sender.send_json_to({"type": "message.send", "content": "Hello"})
    events = []
    while not events or events[-1]["type"] != "generation.done":
        events.append(await next_event(sender, skipping=("engine.status",)))
    assert "conversation.message" not in [e["type"] for e in events]
    conversation = await Conversation.objects.aget()

    await database_sync_to_async(conversation_rename)(conversation=conversation, title="Greetings")
    for socket in (sender, other_tab):
        heard = await next_event(socket, skipping=("engine.status", "conversation.message"))
        while heard["type"] != "conversation.title" or heard["title"] != "Greetings":
            heard = await next_event(socket, skipping=("engine.status", "conversation.message"))
        assert heard == {"type": "conversation.title", "conversation": conversation.id, "title": "Greetings"}
    assert await _quiet(bobs)
    for socket in (sender, other_tab, bobs):
        await socket.disconnect()
