"""The OpenAI wire format: chat and text completions, their chunks, log probabilities, errors.
Pure functions, no I/O: every shape a `/v1` completion sends is made here."""

from __future__ import annotations

import json
from typing import Any

from chatsite.errors import error_body
from inference.streaming.streams import usage

# Shapes made below this layer that a `/v1` body carries as they are: an error's, and the token
# counts every stream's end carries.
__all__ = ["error_body", "usage"]

# vLLM's reasons, as OpenAI names them. A stopped (aborted) stream ends like a natural stop.
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop", "content_filter": "content_filter"}


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
    return _streamed_body("chat.completion.chunk", completion_id, created, model, choices, usage, include_usage)


def _streamed_body(
    kind: str,
    completion_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: Any,
    include_usage: bool,
) -> dict[str, Any]:
    """The body chat chunks and text completions share; `usage` is there (null until the last) when
    the client asked for it."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": kind,
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if include_usage:
        body["usage"] = None if usage is ... else usage
    return body


def delta_choice(
    index: int,
    *,
    content: str | None = None,
    role: str | None = None,
    finish: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if tool_calls:
        delta["tool_calls"] = tool_calls
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def completion(
    *,
    completion_id: str,
    created: int,
    model: str,
    texts: list[str | None],
    reasons: list[str],
    usage: dict[str, int],
    tool_calls: list[list[dict[str, Any]]] | None = None,
    logprobs: list[dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """A chat.completion; `tool_calls`, each choice's calls (OpenAI's shape), where the answers
    were read for them."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": logprobs[i] if logprobs else None,
                "finish_reason": reason,
            }
            for i, (text, reason) in enumerate(zip(texts, reasons, strict=True))
        ],
        "usage": usage,
    }
    for choice, calls in zip(body["choices"], tool_calls or [], strict=False):
        if calls:
            choice["message"]["tool_calls"] = calls
    return body


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


# --- legacy text completions (/v1/completions) -------------------------------------------------------


def text_completion(
    *,
    completion_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: Any = ...,
    include_usage: bool,
) -> dict[str, Any]:
    """A `text_completion`: the whole answer (with usage), or one chunk of a streamed one."""
    return _streamed_body("text_completion", completion_id, created, model, choices, usage, include_usage)


def text_choice(
    index: int, text: str, finish: str | None = None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


# --- log probabilities --------------------------------------------------------------------------------
# The engine hands each sampled token as {"token": text, "logprob": float, "top": [[text, logprob], ...]}
# (`top`: the most likely tokens, most likely first, as many as asked for), and these make OpenAI's
# two shapes of them.

# OpenAI's (and vLLM's) stand-in for a log probability of minus infinity, which JSON cannot carry.
LOGPROB_FLOOR = -9999.0


def _logprob(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(tokens: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat choice's `logprobs`: `content`, one entry per token, each with its `top_logprobs`."""
    return {
        "content": [
            {
                "token": t["token"],
                "logprob": _logprob(t["logprob"]),
                "bytes": _bytes(t["token"]),
                "top_logprobs": [
                    {"token": token, "logprob": _logprob(logprob), "bytes": _bytes(token)}
                    for token, logprob in t["top"]
                ],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def text_logprobs(tokens: list[dict[str, Any]], *, offset: int = 0) -> dict[str, Any]:
    """A text choice's legacy `logprobs`: parallel lists, where `top_logprobs` maps the most likely
    tokens and the sampled one (so up to n + 1 of them, as OpenAI says) to their log probabilities,
    and `text_offset` is where each token starts in the answer (`offset`: the first's)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t["token"])
    return {
        "tokens": [t["token"] for t in tokens],
        "token_logprobs": [_logprob(t["logprob"]) for t in tokens],
        "top_logprobs": [
            {**{token: _logprob(logprob) for token, logprob in t["top"]}, t["token"]: _logprob(t["logprob"])}
            for t in tokens
        ],
        "text_offset": offsets,
    }
