"""The context-window policy, measured with the default model's own tokenizer and chat template."""

from __future__ import annotations

import pytest
from django.conf import settings

from chatsite.errors import ClientError
from conversations.prompts import Turn, assemble_prompt
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.engine.tokenizers import count_tokens, render_chat, tokenizer_for

WINDOW = 2048


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_for(str(settings.INFERENCE_MODELS_DIR / DEFAULT_DEPLOYMENT_FIELDS["model"]))


def turns_of(tokenizer, pairs: int, words: int = 60) -> list[Turn]:
    turns = []
    for i in range(pairs):
        for role in ("user", "assistant"):
            content = f"{role} turn {i}: " + " ".join(f"word{i}x{j}" for j in range(words))
            turns.append(Turn(role=role, content=content, token_count=count_tokens(tokenizer, content)))
    turns.append(Turn(role="user", content="And the newest question?", token_count=6))
    return turns


def assemble(tokenizer, turns, *, system="You are a helpful assistant.", max_output=512, min_output=32):
    return assemble_prompt(
        system_prompt=system,
        turns=turns,
        render=lambda messages: render_chat(tokenizer, messages),
        max_context=WINDOW,
        max_output=max_output,
        min_output=min_output,
    )


def test_a_short_conversation_is_kept_whole(tokenizer):
    turns = turns_of(tokenizer, 2, words=5)
    prompt = assemble(tokenizer, turns)
    assert prompt.turns_dropped == 0
    assert prompt.max_tokens == 512
    text = tokenizer.decode(prompt.token_ids)
    assert "You are a helpful assistant." in text
    assert "user turn 0" in text and "And the newest question?" in text


def test_a_long_conversation_drops_the_oldest_turns_and_keeps_the_system_prompt(tokenizer):
    turns = turns_of(tokenizer, 40)
    prompt = assemble(tokenizer, turns)
    text = tokenizer.decode(prompt.token_ids)
    assert prompt.turns_dropped > 0
    assert text.count("You are a helpful assistant.") == 1
    assert "user turn 0:" not in text
    assert "And the newest question?" in text
    assert len(prompt.token_ids) + prompt.max_tokens <= WINDOW
    # It keeps as much history as fits: one more turn would leave less than a full answer's room.
    kept_start = len(turns) - prompt.turns_kept
    assert turns[kept_start].role == "user"
    assert len(prompt.token_ids) <= WINDOW - 512


def test_the_window_is_never_exceeded_at_its_edge(tokenizer):
    # A newest message that nearly fills the window alone: the answer gets what is left, no more.
    filler = " ".join(["edge"] * 1950)
    turns = turns_of(tokenizer, 3, words=20)[:-1] + [
        Turn(role="user", content=filler, token_count=count_tokens(tokenizer, filler))
    ]
    prompt = assemble(tokenizer, turns)
    assert prompt.turns_kept == 1
    assert 32 <= prompt.max_tokens < 512
    assert len(prompt.token_ids) + prompt.max_tokens == WINDOW


def test_a_message_too_long_for_the_window_is_refused(tokenizer):
    filler = " ".join(["overflow"] * 2100)
    with pytest.raises(ClientError) as refused:
        assemble(tokenizer, [Turn(role="user", content=filler)])
    assert refused.value.code == "context_length_exceeded"


def test_stale_token_counts_cannot_push_the_prompt_past_the_window(tokenizer):
    # Stored counts that claim every message is tiny: the exact rendering still decides.
    turns = [Turn(role=t.role, content=t.content, token_count=1) for t in turns_of(tokenizer, 40)]
    prompt = assemble(tokenizer, turns)
    assert len(prompt.token_ids) <= WINDOW - 512


def test_threads_asking_for_a_tokenizer_at_once_load_it_once_and_share_it():
    from concurrent.futures import ThreadPoolExecutor

    from inference.engine.tokenizers import _tokenizer_load

    path = str(settings.INFERENCE_MODELS_DIR / DEFAULT_DEPLOYMENT_FIELDS["model"])
    _tokenizer_load.cache_clear()
    with ThreadPoolExecutor(max_workers=4) as pool:
        tokenizers = list(pool.map(tokenizer_for, [path] * 4))
    assert all(t is tokenizers[0] for t in tokenizers)
    assert _tokenizer_load.cache_info().misses == 1


INSTRUCTIONS = "The user says this about themselves:\nI am a marine biologist called Zora."


def test_custom_instructions_follow_the_system_prompt_in_its_own_turn(tokenizer):
    turns = turns_of(tokenizer, 1, words=5)
    prompt = assemble_prompt(
        system_prompt="You are a helpful assistant.",
        instructions=INSTRUCTIONS,
        turns=turns,
        render=lambda messages: render_chat(tokenizer, messages),
        max_context=WINDOW,
        max_output=512,
        min_output=32,
    )
    assert prompt.instructions_kept
    text = tokenizer.decode(prompt.token_ids)
    system_turn = text.split("<|im_end|>")[0]
    assert "You are a helpful assistant." in system_turn and "marine biologist called Zora" in system_turn
    assert system_turn.index("helpful assistant") < system_turn.index("Zora")


def test_a_long_conversation_gives_up_its_oldest_turns_before_the_instructions(tokenizer):
    turns = turns_of(tokenizer, 40)
    prompt = assemble_prompt(
        system_prompt="You are a helpful assistant.",
        instructions=INSTRUCTIONS,
        turns=turns,
        render=lambda messages: render_chat(tokenizer, messages),
        max_context=WINDOW,
        max_output=512,
        min_output=32,
    )
    text = tokenizer.decode(prompt.token_ids)
    assert prompt.turns_dropped > 0 and prompt.instructions_kept
    assert "Zora" in text and "And the newest question?" in text
    assert prompt.max_tokens == 512 and len(prompt.token_ids) + prompt.max_tokens <= WINDOW


def test_instructions_that_leave_no_room_for_a_full_answer_give_way_whole(tokenizer):
    """A newest message that, with the instructions, would leave less than a full answer: the
    instructions go (whole, never cut), the message and the system prompt stay."""
    long_message = " ".join(f"fact{i}" for i in range(300))
    turns = [Turn(role="user", content=long_message, token_count=count_tokens(tokenizer, long_message))]
    instructions = "The user asks you to answer like this:\n" + " ".join(f"rule{i}" for i in range(200))
    prompt = assemble_prompt(
        system_prompt="You are a helpful assistant.",
        instructions=instructions,
        turns=turns,
        render=lambda messages: render_chat(tokenizer, messages),
        max_context=WINDOW,
        max_output=512,
        min_output=32,
    )
    text = tokenizer.decode(prompt.token_ids)
    assert not prompt.instructions_kept
    assert "rule0" not in text and "You are a helpful assistant." in text and "fact299" in text
    assert prompt.max_tokens == 512
