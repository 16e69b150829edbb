"""The OpenAI wire format: chunks, completions, errors. Pure functions, no I/O."""

from __future__ import annotations

import json
from typing import Any

from chatsite.errors import error_body

__all__ = ["error_body"]

# vLLM's reasons, as OpenAI names them. A stopped (aborted) stream ends like a natural stop.
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop", "content_filter": "content_filter"}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """Token counts as OpenAI reports them (the chat socket's `generation.done` uses the same shape)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(reason: str | None) -> str:
    return FINISH_REASONS.get(reason or "stop", "stop")


def chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: Any = ...,
    include_usage: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if include_usage:
        body["usage"] = None if usage is ... else usage
    return body


def delta_choice(
    index: int, *, content: str | None = None, role: str | None = None, finish: str | None = None
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


def completion(
    *, completion_id: str, created: int, model: str, texts: list[str], reasons: list[str], usage: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": reason,
            }
            for i, (text, reason) in enumerate(zip(texts, reasons, strict=True))
        ],
        "usage": usage,
    }


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
