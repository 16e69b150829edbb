"""What a model sees of a conversation: the context-window policy and the memory of long conversations.

The rule, in one place, for a model with a window of W tokens. The prompt is one `system` turn (the
deployment's system prompt, then the person's custom instructions, then the instructions of the
project the conversation is in, then the conversation's own system prompt, then any extra `context`
a caller brings, then the summary of the earlier conversation) followed by the newest turns verbatim:
- the system prompt is always kept, and always in its own `system` turn, never mixed with user text;
- the newest user message is always kept;
- each optional block of the system turn is kept, whole, while it, the blocks before it and the
  newest message leave room for a full answer (`reserve` = the deployment's max output, capped at a
  quarter of W): the custom instructions first (marked as the person's), then the project's
  (marked as the project's), then the conversation's system prompt (marked as the person's for this
  conversation), then the summary; a cut block could say the opposite of what was meant;
- `context`, the passages retrieved from the person's files (best first, marked as quoted material
  by the caller, under `context_header`), goes between the instructions and the summary, as many
  whole passages as `context_budget` allows: they compete with the history for what the system
  turn, the newest message and the answer's room leave, taking at most CONTEXT_SHARE of it;
- older turns are added newest first while the prompt leaves room for a full answer, never going
  back past the turns the kept summary stands for (it says what they said);
- so what gives way first is the oldest history, then the summary, the context, the conversation's
  system prompt, the project's instructions, the person's (in that order), then the answer's room: if even the system prompt and the newest message leave
  less than a full answer, the answer gets what is left, down to `min_output` tokens; below that the
  message is refused as too long;
- the answer's max_tokens is cut so that prompt + answer never exceed W.
Counting uses the model's own tokenizer on the rendered chat template, not an estimate.

Memory. When turns fall out of the window, they are summarized instead of being lost: the
assembled prompt says which turns are neither verbatim nor in the summary (`unsummarized`), and the
caller has the summary extended with them in the background (`summary_request_ids`: the new summary
is the utility model's rewrite of the old summary plus those turns only, never a recomputation from
the start). Until that summary is ready, the prompt is the sliding window over what the old summary
(or, with none, nothing) does not cover; a summary that fails changes nothing for the message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chatsite.errors import ClientError
from inference.engine.tokenizers import image_parts

# How a project's instructions are marked inside the system turn: the person's words for the chats
# of one project, read after their custom instructions (which hold for every chat).
PROJECT_HEADING = "This conversation is part of the user's project \"{name}\". The user's instructions for it:"
# How the summary is marked inside the system turn, for the model and for a reader of the prompt.
SUMMARY_HEADING = "Summary of the earlier conversation (older messages are not shown):"
# A summary's length: a small part of the window, so that it never crowds out the recent turns.
SUMMARY_MAX_TOKENS = 256
SUMMARY_MIN_TOKENS = 32
SUMMARY_TEMPERATURE = 0.3
# How a conversation's own system prompt is marked inside the system turn: the person's words.
CONVERSATION_PROMPT_HEADING = "For this conversation, the user asks you to follow these instructions:"

Render = Callable[[list[dict[str, Any]]], list[int]]


@dataclass(frozen=True)
class Turn:
    role: str
    content: str
    token_count: int = 0
    # The caller's name for the turn (a message's id): what a summary says it runs to.
    key: Any = None
    # Images the turn shows a vision model, as placeholders before its text (`image_parts`).
    images: int = 0

    def message(self) -> dict[str, Any]:
        return {"role": self.role, "content": image_parts(self.content, self.images)}


@dataclass(frozen=True)
class Memory:
    """A summary standing for the first `covers` turns of the branch being assembled."""

    text: str
    covers: int


@dataclass(frozen=True)
class AssembledPrompt:
    token_ids: list[int]
    max_tokens: int
    turns_kept: int
    turns_dropped: int
    instructions_kept: bool = False
    project_instructions_kept: bool = False
    conversation_prompt_kept: bool = False
    summary_kept: bool = False
    context_kept: bool = False
    # Turns [start, end) that are neither verbatim nor in the summary: what the summary should take in.
    unsummarized: tuple[int, int] = (0, 0)
    # How many of the retrieved passages (a prefix of `context`, so their numbers hold) went in.
    passages_kept: int = 0

    @property
    def needs_summary(self) -> bool:
        return self.unsummarized[1] > self.unsummarized[0]


# The most of the window's free room (what the system turn, the newest message and the answer's
# reserve leave) that passages from the person's files may take; the history has the rest.
CONTEXT_SHARE = 0.5


def context_budget(*, max_context: int, reserve: int, base_tokens: int, passage_tokens: Sequence[int]) -> int:
    """How many retrieved passages (best first) go into the prompt: the one rule by which quoted
    passages from the person's files compete with the conversation's history for the window.

    `base_tokens` is the prompt with the system turn and the newest message alone. Of the room left
    after it and the answer's `reserve`, the passages take at most CONTEXT_SHARE, whole and in
    order: the first that does not fit ends them (a cut passage could lose what made it relevant,
    and a later, weaker one should not jump the queue). The history gets the rest of the room,
    including whatever the passages did not use. Nothing fits, nothing goes in."""
    allowance = int(max(0, max_context - reserve - base_tokens) * CONTEXT_SHARE)
    used = kept = 0
    for tokens in passage_tokens:
        if used + tokens > allowance:
            break
        used += tokens
        kept += 1
    return kept


def system_text(system_prompt: str, instructions: str) -> str:
    """The one `system` turn: the deployment's prompt, then the person's own instructions."""
    return "\n\n".join(part for part in (system_prompt.strip(), instructions.strip()) if part)


def project_block(name: str, instructions: str) -> str:
    """A project's instructions as the system turn carries them; "" when it has none."""
    if not instructions.strip():
        return ""
    return f"{PROJECT_HEADING.format(name=' '.join(name.split()))}\n{instructions.strip()}"


def summary_block(text: str) -> str:
    return f"{SUMMARY_HEADING}\n{text.strip()}"


def summary_max_tokens(max_context: int) -> int:
    """How long a summary may be for a model with this window."""
    return max(SUMMARY_MIN_TOKENS, min(SUMMARY_MAX_TOKENS, max_context // 8))


def prompt_assemble(
    *,
    system_prompt: str,
    turns: Sequence[Turn],
    render: Render,
    max_context: int,
    max_output: int,
    min_output: int,
    instructions: str = "",
    project_instructions: str = "",
    conversation_prompt: str = "",
    context: Sequence[str] = (),
    context_header: str = "",
    memory: Memory | None = None,
    tail: Sequence[dict[str, Any]] = (),
) -> AssembledPrompt:
    """The prompt for the answer to `turns[-1]` under the policy above (the module's docstring).
    `project_instructions`: the project's block as `project_block` writes it. `tail`: the answer's
    tool steps so far (assistant turns with their calls, tool turns with their results), which go
    after the newest turn and are kept with it, whole (orchestration.tools.loop)."""
    if not turns:
        raise ValueError("a prompt needs at least one turn")
    reserve = max(min(max_output, max_context // 4), min_output)
    newest = [turns[-1].message(), *tail]
    last = len(turns) - 1
    # The summary may stand only for turns before the newest one.
    if memory is not None and not (memory.text.strip() and 0 < memory.covers <= last):
        memory = None

    kept: dict[str, bool] = {
        "instructions": False,
        "project_instructions": False,
        "conversation_prompt": False,
        "summary": False,
    }
    parts = [system_prompt.strip()] if system_prompt.strip() else []

    def keep_if_it_fits(name: str, block: str) -> None:
        if not block.strip():
            return
        trial = "\n\n".join([*parts, block.strip()])
        if len(render([{"role": "system", "content": trial}, *newest])) + reserve <= max_context:
            parts.append(block.strip())
            kept[name] = True

    keep_if_it_fits("instructions", instructions)
    keep_if_it_fits("project_instructions", project_instructions)
    if conversation_prompt.strip():
        keep_if_it_fits("conversation_prompt", f"{CONVERSATION_PROMPT_HEADING}\n{conversation_prompt.strip()}")
    passages_kept = 0
    if context:
        base = len(render([{"role": "system", "content": "\n\n".join(parts)}, *newest]))
        empty = len(render([{"role": "system", "content": ""}]))
        sizes = [len(render([{"role": "system", "content": "\n\n" + p}])) - empty for p in context]
        header = len(render([{"role": "system", "content": "\n\n" + context_header}])) - empty
        passages_kept = context_budget(
            max_context=max_context, reserve=reserve, base_tokens=base + header, passage_tokens=sizes
        )
        if passages_kept:
            parts.append("\n\n".join([context_header, *context[:passages_kept]]).strip())
    keep_if_it_fits("summary", summary_block(memory.text) if memory is not None else "")
    system = [{"role": "system", "content": "\n\n".join(parts)}] if parts else []
    floor = memory.covers if memory is not None and kept["summary"] else 0

    def ids_from(start: int) -> list[int]:
        return render(system + [t.message() for t in turns[start:]] + list(tail))

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
        while start > floor and used + turns[start - 1].token_count + 8 <= budget:
            start -= 1
            used += turns[start].token_count + 8
        while turns[start].role != "user" and start < last:
            start += 1
        ids = newest_only if start == last else ids_from(start)  # a first message: rendered already
        while len(ids) > budget and start < last:
            start += 1
            while turns[start].role != "user" and start < last:
                start += 1
            ids = ids_from(start)
    covered = memory.covers if memory is not None else 0
    return AssembledPrompt(
        token_ids=ids,
        max_tokens=min(max_output, max_context - len(ids)),
        turns_kept=len(turns) - start,
        turns_dropped=start,
        instructions_kept=kept["instructions"],
        project_instructions_kept=kept["project_instructions"],
        conversation_prompt_kept=kept["conversation_prompt"],
        summary_kept=kept["summary"],
        context_kept=passages_kept > 0,
        unsummarized=(covered, start) if start > covered else (0, 0),
        passages_kept=passages_kept,
    )


def summary_prompt_messages(*, previous: str, turns: Sequence[Turn], chars: int | None = None) -> list[dict[str, str]]:
    """The request that extends a summary: the summary so far and the turns that fell out since,
    quoted as material, and one instruction. `chars`: each turn cut to this many characters."""
    shown = "\n".join(f"{'User' if t.role == 'user' else 'Assistant'}: {_shortened(t.content, chars)}" for t in turns)
    return [
        {"role": "system", "content": "You keep a short running summary of a conversation."},
        {
            "role": "user",
            "content": (
                f"Summary so far:\n{previous.strip() or '(nothing yet)'}\n\n"
                f"Messages since:\n{shown}\n\n"
                "Write the updated summary in a few sentences: what the user wants, the facts and "
                "decisions so far. Reply with the summary only."
            ),
        },
    ]


def summary_request_ids(
    *, previous: str, turns: Sequence[Turn], render: Render, max_context: int, max_tokens: int
) -> list[int] | None:
    """The summary request's prompt, within the utility model's window with room for `max_tokens`:
    turns too long for it are cut (each to the same length, halved until it fits). None when even
    that does not fit: the conversation then goes on with the sliding window."""
    chars: int | None = None
    longest = max((len(t.content) for t in turns), default=0)
    while True:
        ids = render(summary_prompt_messages(previous=previous, turns=turns, chars=chars))
        if len(ids) + max_tokens <= max_context:
            return ids
        if chars is not None and chars <= 16:
            return None
        chars = (chars or longest) // 2


def summary_clean(text: str) -> str:
    """The summary as it goes into prompts and onto the page: its own words, without a label."""
    text = text.strip()
    for label in ("summary:", "updated summary:"):
        if text.lower().startswith(label):
            text = text[len(label) :].strip()
    return text


def _shortened(text: str, chars: int | None) -> str:
    text = " ".join(text.split())
    return text if chars is None or len(text) <= chars else text[:chars] + "…"
