"""Prompt assembly and the context-window policy.

The policy, for a model with a window of W tokens:
- the system prompt is always kept, and always as its own `system` turn, never mixed with user text;
- the newest user message is always kept;
- older turns are added newest first while the prompt leaves room for a full answer
  (`reserve` = the deployment's max output, capped at a quarter of W);
- if even the system prompt and the newest message leave less than that room, the answer gets what
  is left, down to `min_output` tokens; below that the message is refused as too long;
- the answer's max_tokens is cut so that prompt + answer never exceed W.
Counting uses the model's own tokenizer on the rendered chat template, not an estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chatsite.errors import ClientError


@dataclass(frozen=True)
class Turn:
    role: str
    content: str
    token_count: int = 0


@dataclass(frozen=True)
class AssembledPrompt:
    token_ids: list[int]
    max_tokens: int
    turns_kept: int
    turns_dropped: int


def assemble_prompt(
    *,
    system_prompt: str,
    turns: Sequence[Turn],
    render: Callable[[list[dict[str, str]]], list[int]],
    max_context: int,
    max_output: int,
    min_output: int,
) -> AssembledPrompt:
    if not turns:
        raise ValueError("a prompt needs at least one turn")
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    reserve = max(min(max_output, max_context // 4), min_output)

    def ids_from(start: int) -> list[int]:
        return render(system + [{"role": t.role, "content": t.content} for t in turns[start:]])

    last = len(turns) - 1
    newest_only = ids_from(last)
    if len(newest_only) + min_output > max_context:
        raise ClientError(
            f"This message is too long for the model: it needs {len(newest_only)} tokens and the model's "
            f"window is {max_context}. Shorten it and try again.",
            code="context_length_exceeded",
            param="messages",
        )
    budget = max_context - reserve
    if len(newest_only) > budget:
        start, ids = last, newest_only
    else:
        # Estimate the start from stored per-message counts, then confirm with the exact rendering.
        start, used = last, len(newest_only)
        while start > 0 and used + turns[start - 1].token_count + 8 <= budget:
            start -= 1
            used += turns[start].token_count + 8
        while turns[start].role != "user" and start < last:
            start += 1
        ids = ids_from(start)
        while len(ids) > budget and start < last:
            start += 1
            while turns[start].role != "user" and start < last:
                start += 1
            ids = ids_from(start)
    max_tokens = min(max_output, max_context - len(ids))
    return AssembledPrompt(token_ids=ids, max_tokens=max_tokens, turns_kept=len(turns) - start, turns_dropped=start)
