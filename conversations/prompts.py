"""Prompt assembly and the context-window policy.

The policy, for a model with a window of W tokens:
- the system prompt is always kept, and always as its own `system` turn, never mixed with user text;
- the newest user message is always kept;
- the person's custom instructions (`instructions`: what the model should know about them, how it
  should answer; marked as theirs) follow the system prompt in the same `system` turn, kept while
  they, the system prompt and the newest message leave room for a full answer;
- older turns are added newest first while the prompt leaves room for a full answer
  (`reserve` = the deployment's max output, capped at a quarter of W);
- so what gives way first is the oldest history, then the custom instructions (whole: a cut
  instruction could say the opposite of what was meant), then the answer's room: if even the system
  prompt and the newest message leave less than a full answer, the answer gets what is left, down to
  `min_output` tokens; below that the message is refused as too long;
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
    instructions_kept: bool = False


def system_text(system_prompt: str, instructions: str) -> str:
    """The one `system` turn: the deployment's prompt, then the person's own instructions."""
    return "\n\n".join(part for part in (system_prompt.strip(), instructions.strip()) if part)


def assemble_prompt(
    *,
    system_prompt: str,
    turns: Sequence[Turn],
    render: Callable[[list[dict[str, str]]], list[int]],
    max_context: int,
    max_output: int,
    min_output: int,
    instructions: str = "",
) -> AssembledPrompt:
    if not turns:
        raise ValueError("a prompt needs at least one turn")
    reserve = max(min(max_output, max_context // 4), min_output)
    newest = [{"role": turns[-1].role, "content": turns[-1].content}]
    instructions_kept = False
    if instructions.strip():
        full = system_text(system_prompt, instructions)
        if len(render([{"role": "system", "content": full}, *newest])) + reserve <= max_context:
            system_prompt, instructions_kept = full, True
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []

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
    return AssembledPrompt(
        token_ids=ids,
        max_tokens=max_tokens,
        turns_kept=len(turns) - start,
        turns_dropped=start,
        instructions_kept=instructions_kept,
    )
