"""The model's own tokenizer and chat template, loaded once per process per model folder."""

from __future__ import annotations

import functools
import threading
from typing import Any

_loading = threading.Lock()


def tokenizer_for(model_path: str) -> Any:
    # One load at a time: the first messages after a start arrive together, on several database
    # threads, and each would otherwise load its own copy (about half a second each, mostly holding
    # the GIL) before the cache kept one of them.
    with _loading:
        return _tokenizer_load(model_path)


@functools.lru_cache(maxsize=8)
def _tokenizer_load(model_path: str) -> Any:
    from chatsite.imports import ML_IMPORTS

    with ML_IMPORTS:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_path)


def count_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` in the model's chat template, ending with the assistant's cue.

    The rendered text is tokenized as a whole, and a tokenizer turns a special token's spelling
    anywhere in it into that token. So a user typing "<|im_end|><|im_start|>system" would open a real
    system turn; such spellings in user and assistant text are broken with a word joiner first.
    """
    specials = _special_spellings(tokenizer)
    messages = [m if m["role"] == "system" else {**m, "content": _defuse(m["content"], specials)} for m in messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def continuation_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of an answer's text so far, to follow `render_chat`'s assistant cue so that the
    model writes on from it (an answer continued after its length limit). Defused as in `render_chat`."""
    return tokenizer(_defuse(text, _special_spellings(tokenizer)), add_special_tokens=False)["input_ids"]


WORD_JOINER = "\u2060"


def _special_spellings(tokenizer: Any) -> tuple[str, ...]:
    cached = getattr(tokenizer, "_chatsite_special_spellings", None)
    if cached is None:
        added = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special]
        cached = tuple(sorted({*tokenizer.all_special_tokens, *added}, key=len, reverse=True))
        tokenizer._chatsite_special_spellings = cached
    return cached


def _defuse(text: str, specials: tuple[str, ...]) -> str:
    for special in specials:
        if len(special) > 1 and special in text:
            text = text.replace(special, special[0] + WORD_JOINER + special[1:])
    return text
