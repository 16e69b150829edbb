"""The model's own tokenizer and chat template, loaded once per process per model folder."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path
from typing import Any, TypeAlias

from chatsite.imports import ML_IMPORTS

_loading = threading.Lock()

# A Hugging Face tokenizer (transformers' PreTrainedTokenizerBase), whose own annotations are too loose
# to check the calls made of it here.
Tokenizer: TypeAlias = Any


def tokenizer_for(model_path: str) -> Tokenizer:
    # One load at a time: the first messages after a start arrive together, on several database
    # threads, and each would otherwise load its own copy (about half a second each, mostly holding
    # the GIL) before the cache kept one of them.
    with _loading:
        return _tokenizer_load(model_path)


@functools.lru_cache(maxsize=8)
def _tokenizer_load(model_path: str) -> Any:
    with ML_IMPORTS:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_path)


def count_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    chat_template: str = "",
) -> list[int]:
    """Token ids of `messages` in the model's chat template, ending with the assistant's cue.

    `chat_template`: a deployment's own template (`chat_template_text`), in place of the model's.
    A message's `content` may be a list of parts (`image_parts`) for a vision model: its template
    writes each `{"type": "image"}` part as the model's image placeholder.
    `tools`: OpenAI function tools, which the template renders (the system turn, for most). An
    assistant turn's `tool_calls` reach the template with their arguments as objects, as vLLM gives
    them, since templates write them with `tojson`.

    The rendered text is tokenized as a whole, and a tokenizer turns a special token's spelling
    anywhere in it into that token. So a user typing "<|im_end|><|im_start|>system" would open a real
    system turn; such spellings in user, assistant and tool text, tool calls and tool definitions
    are broken with a word joiner first.
    """
    specials = _special_spellings(tokenizer)
    messages = [m if m["role"] == "system" else _defused_message(m, specials) for m in messages]
    extra: dict[str, Any] = {}
    if tools:
        extra["tools"] = json.loads(_defuse(json.dumps(tools, ensure_ascii=False), specials))
    template = chat_template_text(chat_template)
    if template is not None:
        extra["chat_template"] = template
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _defused_message(message: dict[str, Any], specials: tuple[str, ...]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, list):
        # Content parts (a vision model's turn): its text parts defused, its image placeholders kept.
        content = [
            {**part, "text": _defuse(part["text"], specials)} if part.get("type") == "text" else part
            for part in content
        ]
    else:
        content = _defuse(content or "", specials)
    defused = {**message, "content": content}
    if message.get("tool_calls"):
        # A special spelling can only sit inside a JSON string, so the JSON stays valid.
        defused["tool_calls"] = [
            {
                **call,
                "function": {
                    "name": call["function"]["name"],
                    "arguments": json.loads(_defuse(call["function"]["arguments"], specials)),
                },
            }
            for call in message["tool_calls"]
        ]
    return defused


def image_parts(text: str, images: int) -> list[dict[str, Any]] | str:
    """A user turn's content for a vision model's chat template: an image part (its placeholder) for
    each image, then the text, as Hugging Face's multimodal templates take them; plain text without images."""
    if not images:
        return text
    return [*({"type": "image"} for _ in range(images)), {"type": "text", "text": text}]


CHAT_TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "chat_templates"


def chat_template_text(chat_template: str) -> str | None:
    """A deployment's `chat_template` as Jinja text: None for the model's own (blank), the file of
    that name in inference/chat_templates/, or the text itself (anything with a Jinja tag in it)."""
    if not chat_template:
        return None
    if "{{" in chat_template or "{%" in chat_template:
        return chat_template
    return _chat_template_file(chat_template)


@functools.lru_cache(maxsize=16)
def _chat_template_file(name: str) -> str:
    path = (CHAT_TEMPLATES_DIR / name).resolve()
    if path.parent != CHAT_TEMPLATES_DIR or not path.is_file():
        raise ValueError(f"No chat template named {name!r} in {CHAT_TEMPLATES_DIR}.")
    return path.read_text()


def continuation_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of an answer's text so far, to follow `render_chat`'s assistant cue so that the
    model writes on from it (an answer continued after its length limit). Defused as in `render_chat`."""
    return tokenizer(_defuse(text, _special_spellings(tokenizer)), add_special_tokens=False)["input_ids"]


def special_tokens_defused(tokenizer: Any, text: str) -> str:
    """`text` with its special-token spellings broken as `render_chat` breaks them in user text: for
    untrusted text that goes into a system turn (passages quoted from files)."""
    return _defuse(text, _special_spellings(tokenizer))


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
