"""A conversation's own settings: a system prompt and a temperature for its answers, within the
plan's limits, set through the conversations API by its owner only."""

from __future__ import annotations

import pytest

from accounts.models import Tier, UserSettings
from accounts.services import user_set_tier
from conversations.models import Conversation
from conversations.prompts import Turn, assemble_prompt
from conversations.requests import AnswerRequest, SendRequest
from conversations.services import conversation_create, message_regenerate, message_send
from inference.engine.tokenizers import tokenizer_for
from inference.services import generation_finish
from orchestration.memory import CONVERSATION_PROMPT_HEADING
from tests.conversations.test_apis import client_for


def _url(conversation: Conversation) -> str:
    return f"/api/conversations/{conversation.id}/settings/"


def _stored(conversation: Conversation) -> tuple[str, float | None]:
    fresh = Conversation.objects.get(id=conversation.id)
    return fresh.system_prompt, fresh.temperature


def test_the_owner_sets_and_reads_a_conversations_settings_within_the_plans_limits(alice):
    conversation = conversation_create(user=alice)
    client = client_for(alice)
    empty = client.get(_url(conversation)).json()
    assert empty == {
        "system_prompt": "",
        "temperature": None,
        "system_prompt_chars": 1000,  # the free plan's
        "temperature_min": 0.0,
        "temperature_max": 2.0,
    }
    saved = client.put(
        _url(conversation), {"system_prompt": "  Answer as a pirate. ", "temperature": 1.2}, format="json"
    )
    assert saved.status_code == 200, saved.json()
    assert _stored(conversation) == ("Answer as a pirate.", 1.2)
    assert client.get(_url(conversation)).json()["temperature"] == 1.2
    # null: back to the model's own temperature.
    client.put(_url(conversation), {"system_prompt": "", "temperature": None}, format="json")
    assert _stored(conversation) == ("", None)


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ({"temperature": 2.01}, "invalid_temperature", "between 0 and 2"),
        ({"temperature": -0.5}, "invalid_temperature", "between 0 and 2"),
        ({"system_prompt": "x" * 1001}, "system_prompt_too_long", "at most 1000 characters"),
        ({"temperature": "hot"}, "invalid_request", "'temperature' must be a number"),
        ({"temperature": True}, "invalid_request", "'temperature' must be a number"),
        ({"system_prompt": ["a"]}, "invalid_request", "'system_prompt' must be text"),
        ({"system_prompt": "a\x00b"}, "invalid_request", "NUL"),
    ],
)
def test_settings_out_of_bounds_are_refused_with_a_clear_message_and_nothing_is_saved(alice, body, code, says):
    conversation = conversation_create(user=alice)
    client = client_for(alice)
    client.put(_url(conversation), {"system_prompt": "Be brief.", "temperature": 0.5}, format="json")
    refused = client.put(_url(conversation), {"system_prompt": "Changed.", "temperature": 0.7, **body}, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == code and says in refused.json()["error"]["message"]
    assert _stored(conversation) == ("Be brief.", 0.5)


def test_the_system_prompts_length_is_the_plans(alice):
    conversation = conversation_create(user=alice)
    client = client_for(alice)
    assert client.put(_url(conversation), {"system_prompt": "x" * 3000}, format="json").status_code == 400
    user_set_tier(user=alice, tier=Tier.objects.get(name="pro"))
    assert client.put(_url(conversation), {"system_prompt": "x" * 3000}, format="json").status_code == 200
    assert client.get(_url(conversation)).json()["system_prompt_chars"] == 4000


def test_another_users_conversation_settings_are_not_found_and_not_changed(alice, mallory):
    conversation = conversation_create(user=alice)
    client_for(alice).put(_url(conversation), {"system_prompt": "Alice's secret prompt."}, format="json")
    client = client_for(mallory)
    assert client.get(_url(conversation)).status_code == 404
    changed = client.put(_url(conversation), {"system_prompt": "Mallory's", "temperature": 2}, format="json")
    assert changed.status_code == 404 and "secret" not in changed.content.decode()
    assert _stored(conversation) == ("Alice's secret prompt.", None)


def test_a_key_without_the_write_scope_cannot_change_them(alice):
    conversation = conversation_create(user=alice)
    reader = client_for(alice, scopes=["conversations:read"])
    assert reader.get(_url(conversation)).status_code == 200
    assert reader.put(_url(conversation), {"temperature": 1}, format="json").status_code == 403


def _system_turn(generation) -> str:
    text = tokenizer_for(generation.deployment.model_path).decode(generation.prompt_token_ids)
    return text.split("<|im_end|>")[0]


@pytest.mark.topology
def test_the_system_prompt_follows_the_persons_instructions_and_the_temperature_samples_every_answer(alice):
    UserSettings.objects.create(user=alice, answer_style="Answer in one sentence.")
    first = message_send(user=alice, request=SendRequest(content="Hello"))
    generation_finish(generation_id=first.generation.id, status="complete", text="Hi.", finish_reason="stop")
    Conversation.objects.filter(id=first.conversation.id).update(system_prompt="Answer as a pirate.", temperature=1.4)

    sent = message_send(
        user=alice, request=SendRequest(content="Where is Paris?", conversation_id=first.conversation.id)
    )
    system = _system_turn(sent.generation)
    assert system.index("Answer in one sentence.") < system.index(CONVERSATION_PROMPT_HEADING)
    assert system.index(CONVERSATION_PROMPT_HEADING) < system.index("Answer as a pirate.")
    assert sent.generation.sampling["temperature"] == 1.4
    generation_finish(generation_id=sent.generation.id, status="complete", text="Arr.", finish_reason="stop")
    again = message_regenerate(user=alice, request=AnswerRequest(message_id=sent.assistant_message.id))
    assert "Answer as a pirate." in _system_turn(again.generation)
    assert again.generation.sampling["temperature"] == 1.4
    # Another conversation of hers has neither.
    other = message_send(user=alice, request=SendRequest(content="Where is Paris?"))
    assert "pirate" not in _system_turn(other.generation)
    assert other.generation.sampling["temperature"] == first.generation.sampling["temperature"]


def test_a_conversation_prompt_that_leaves_no_room_for_the_answer_gives_way_before_the_instructions():
    def render(messages):  # one token a character: the policy's arithmetic made plain
        return [0] * sum(len(m["content"]) + 4 for m in messages)

    turns = [Turn(role="user", content="Hi", token_count=2)]
    common = {"system_prompt": "S", "turns": turns, "render": render, "max_output": 50, "min_output": 8}
    fits = assemble_prompt(**common, max_context=400, instructions="I" * 50, conversation_prompt="C" * 100)
    assert fits.instructions_kept and fits.conversation_prompt_kept
    squeezed = assemble_prompt(**common, max_context=200, instructions="I" * 50, conversation_prompt="C" * 100)
    assert squeezed.instructions_kept and not squeezed.conversation_prompt_kept
