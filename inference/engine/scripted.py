"""The scripted engine: answers without a model, for tests, load tests and demos, never for users' answers.

It honours what the service asks of an engine host (`EngineHostBase`) and nothing else: deltas
streamed at a set rate (`EngineSpec.tokens_per_s`; 0 streams as fast as the loop turns), `max_tokens`
(finish reason "length"), stop strings and stop token ids ("stop"), an abort (the consuming task
cancelled: the request ends at once), token counts in the deployment's own tokenizer, log probabilities
(each token certain) and tool calls. Nothing is sampled: the same prompt gets the same answer.

What it writes:
- a tool call, in the deployment's own format, when the request forces one (`tool_choice` "required"
  or a named function) or offers tools and its newest user turn says `[call <name>]`. The format comes
  from the structural tag vLLM's tool parser made for the request (`inference.openai.tools`), whose
  tags hold the call's exact opening and closing text; the arguments are a value of the tool's schema;
- an object of the schema a `response_format` asks for;
- else a text answer that quotes the start of the newest user turn and then `PASSAGE`, ended as a
  model ends (finish reason "stop") unless `max_tokens` comes first, or `ignore_eos` / `min_tokens`
  make it write the passage again, as does `[write on]` in the newest user turn (a long answer, as
  a person asking for a story gets: it ends only at `max_tokens`).

Each request's input is kept exactly as vLLM would be given it (`inputs`, by request id: the
prompt's token ids and, for a vision deployment, its images under `multi_modal_data`), for tests to
read; each image counts IMAGE_TOKENS prompt tokens in what it reports, as a vision model's expand.

It loads only the tokenizer (well under a second for the default model) and imports nothing of vLLM.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any

from inference.engine.base import Delta, EngineHostBase, EngineRequestError, EngineSpec, engine_prompt
from inference.engine.tokenizers import tokenizer_for

PASSAGE = (
    "This answer comes from the scripted engine, not from a model. It writes the same words at a steady "
    "pace, so that everything around the engine can be tried without one: streaming, stopping, limits, "
    "usage and tool calls. Nothing here was generated."
)
# In a user's turn, asks for a call of that tool when the request offers it (`tool_choice` "auto").
CALL_REQUEST = re.compile(r"\[call ([A-Za-z0-9_-]{1,64})\]")
# In a user's turn, asks for an answer that goes on until `max_tokens`.
WRITE_ON = "[write on]"
QUOTED_CHARS = 80
# What the scripted engine says one image took of the prompt, as vLLM reports a vision model's
# expanded image tokens (a model's own figure is hundreds).
IMAGE_TOKENS = 64
# The engine inputs kept for a test to read (`inputs`), newest last.
INPUTS_KEPT = 64
SENTINEL = "\u2063scripted-user-turn\u2063"


class ScriptedEngineHost(EngineHostBase):
    kind = "scripted"

    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        self._tokenizer: Any = None
        self._user_turn: tuple[str, str] | None = None
        self._live: set[str] = set()
        # Each request's input exactly as vLLM would be given it (`engine_prompt`), by request id.
        self.inputs: OrderedDict[str, dict[str, Any]] = OrderedDict()

    async def _open(self) -> None:
        self._tokenizer = await asyncio.to_thread(tokenizer_for, self.spec.model_path)
        self._user_turn = user_turn_marks(self._tokenizer)
        self.dtype = self.kind

    async def stream(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: dict[str, Any],
        priority: int = 0,
        images: Sequence[bytes] = (),
    ) -> AsyncGenerator[Delta, None]:
        await self.wait_ready()
        request = ScriptedRequest.parse(sampling)
        self.inputs[request_id] = engine_prompt(prompt_token_ids=prompt_token_ids, images=images)
        while len(self.inputs) > INPUTS_KEPT:
            self.inputs.popitem(last=False)
        if request.max_tokens is None:  # as vLLM: the rest of the window
            request.max_tokens = max(1, self.spec.max_context - len(prompt_token_ids))
        text, ended = self._answer(prompt_token_ids, request)
        prompt_tokens = len(prompt_token_ids) + IMAGE_TOKENS * len(images)
        writer = StopWriter(request.stop, keep=request.include_stop)
        started = time.monotonic()
        self._live.add(request_id)
        try:
            for count, (token_id, piece) in enumerate(self._tokens(text, ended, request), start=1):
                # On a schedule, not after a sleep each: a late step does not push the rest back.
                delay = started + count / self.spec.tokens_per_s - time.monotonic() if self.spec.tokens_per_s else 0
                await asyncio.sleep(max(0.0, delay))
                reason = None
                if token_id is None or token_id in request.stop_token_ids:
                    shown, reason = writer.end(), "stop"
                else:
                    shown, stopped = writer.add(piece)
                    if stopped:
                        reason = "stop"
                    elif count == request.max_tokens:
                        shown, reason = shown + writer.end(), "length"
                logprobs = None
                if request.logprobs is not None:
                    logprobs = [{"token": piece, "logprob": 0.0, "top": [[piece, 0.0]][: request.logprobs]}]
                yield Delta(
                    text=shown,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=count,
                    finished=reason is not None,
                    finish_reason=reason,
                    logprobs=logprobs,
                )
                if reason is not None:
                    return
        finally:
            self._live.discard(request_id)

    def _answer(self, prompt_token_ids: list[int], request: ScriptedRequest) -> tuple[str, bool]:
        """The answer's whole text, and whether it ends there (True) or is written again."""
        user_text = self._newest_user_text(prompt_token_ids)
        if request.tags:
            asked = CALL_REQUEST.search(user_text)
            tag = tool_tag(request.tags, asked.group(1) if asked else None, forced=request.forced)
            if tag is not None:
                return tag["begin"] + json.dumps(schema_value(tag["content"].get("json_schema") or {})) + tag[
                    "end"
                ], True
        if request.json_schema is not None:
            return json.dumps(schema_value(request.json_schema)), True
        quoted = " ".join(user_text.split())[:QUOTED_CHARS]
        opening = f'You said "{quoted}". ' if quoted else ""
        return opening + PASSAGE, not (request.ignore_eos or WRITE_ON in user_text)

    def _newest_user_text(self, prompt_token_ids: list[int]) -> str:
        if self._user_turn is None:
            return ""
        opener, closer = self._user_turn
        prompt = self._tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        at = prompt.rfind(opener)
        if at < 0:
            return ""
        turn = prompt[at + len(opener) :]
        return turn[: turn.find(closer)] if closer in turn else turn

    def _tokens(self, text: str, ended: bool, request: ScriptedRequest) -> Iterator[tuple[int | None, str]]:
        """The answer's tokens as (id, text), then None for its end of sequence, which counts as a
        token as a model's does; written again (with a space between) while it may not end yet."""
        once = token_pieces(self._tokenizer, text)
        again = token_pieces(self._tokenizer, " " + text)
        written = 0
        pieces = once
        while True:
            for token in pieces:
                written += 1
                yield token
            if ended and written >= request.min_tokens:
                yield None, ""
                return
            pieces = again

    def unfinished_requests(self) -> int:
        return len(self._live)

    def shutdown(self) -> None:
        self._live.clear()
        super().shutdown()


class ScriptedRequest:
    """The sampling fields the scripted engine reads, checked as vLLM checks them; the rest (the
    temperature, penalties, seed) change nothing in a scripted answer."""

    def __init__(self, sampling: dict[str, Any]) -> None:
        self.max_tokens: int | None = sampling.get("max_tokens")
        self.min_tokens: int = sampling.get("min_tokens") or 0
        self.stop: list[str] = list(sampling.get("stop") or [])
        self.stop_token_ids: set[int] = set(sampling.get("stop_token_ids") or [])
        self.include_stop: bool = bool(sampling.get("include_stop_str_in_output"))
        self.ignore_eos: bool = bool(sampling.get("ignore_eos"))
        self.logprobs: int | None = sampling.get("logprobs")
        structured = sampling.get("structured_outputs") or {}
        self.json_schema: dict[str, Any] | None = None
        self.tags: list[dict[str, Any]] = []
        self.forced = False
        if "structural_tag" in structured:
            tag = json.loads(structured["structural_tag"])
            self.tags = list(_tags(tag))
            self.forced = tag.get("format", {}).get("type") == "tags_with_separator"
            # Tools offered beside a response_format: an answer that calls none follows the format.
            self.json_schema = next(_schemas_outside_tags(tag), None)
        elif "json" in structured:
            schema = structured["json"]
            self.json_schema = json.loads(schema) if isinstance(schema, str) else schema
        elif "json_object" in structured:
            self.json_schema = {"type": "object"}
        elif structured:
            raise EngineRequestError(f"the scripted engine cannot follow {', '.join(sorted(structured))}")

    @classmethod
    def parse(cls, sampling: dict[str, Any]) -> ScriptedRequest:
        try:
            request = cls(sampling)
        except (TypeError, ValueError, AttributeError) as exc:
            raise EngineRequestError(f"invalid sampling parameters: {exc}") from None
        if request.max_tokens is not None and (not isinstance(request.max_tokens, int) or request.max_tokens < 1):
            raise EngineRequestError("invalid sampling parameters: max_tokens must be at least 1")
        if not all(isinstance(s, str) and s for s in request.stop):
            raise EngineRequestError("invalid sampling parameters: stop must be non-empty strings")
        return request


class StopWriter:
    """Passes text on until a stop string appears, holding back a tail that may be the start of
    one, as vLLM's detokenizer does; the stop string itself is left out unless `keep`."""

    def __init__(self, stops: list[str], *, keep: bool) -> None:
        self.stops = stops
        self.keep = keep
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.shown = 0

    def add(self, piece: str) -> tuple[str, bool]:
        """What to show now, and whether a stop string ended the text."""
        searched_from = max(0, self.shown - self.hold)
        self.text += piece
        found = [(at, s) for s in self.stops if (at := self.text.find(s, searched_from)) >= 0]
        if found:
            at, stop = min(found)
            self.text = self.text[: at + len(stop) if self.keep else at]
            return self.end(), True
        upto = max(self.shown, len(self.text) - self.hold)
        shown, self.shown = self.text[self.shown : upto], upto
        return shown, False

    def end(self) -> str:
        rest, self.shown = self.text[self.shown :], len(self.text)
        return rest


def token_pieces(tokenizer: Any, text: str) -> list[tuple[int | None, str]]:
    """`text` as the tokenizer splits it: each token's id and the text it adds."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    starts = [0] + [max(start, 0) for start, _ in offsets[1:]] + [len(text)]
    for i in range(1, len(starts)):
        starts[i] = max(starts[i], starts[i - 1])
    return [(token_id, text[starts[i] : starts[i + 1]]) for i, token_id in enumerate(ids)]


def user_turn_marks(tokenizer: Any) -> tuple[str, str] | None:
    """What opens and closes a user's turn in the tokenizer's chat template ("<|im_start|>user\\n",
    "<|im_end|>" in ChatML), learnt by rendering a turn; None without a template."""
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    except Exception:
        return None
    before, found, after = rendered.partition(SENTINEL)
    specials = [s for s in tokenizer.all_special_tokens if s]
    opened = max((before.rfind(s) for s in specials), default=-1)
    closes = [after.find(s) + len(s) for s in specials if s in after]
    if not found or opened < 0 or not closes:
        return None
    return before[opened:], after[: min(closes)]


def _tags(node: Any) -> Iterator[dict[str, Any]]:
    """The `tag` formats anywhere in a structural tag (each a call's begin, content and end)."""
    if isinstance(node, dict):
        if node.get("type") == "tag" and isinstance(node.get("begin"), str):
            yield node
            return
        for value in node.values():
            yield from _tags(value)
    elif isinstance(node, list):
        for value in node:
            yield from _tags(value)


def _schemas_outside_tags(node: Any) -> Iterator[dict[str, Any]]:
    """The JSON schemas of a structural tag that are not a call's arguments (a response_format's)."""
    if isinstance(node, dict):
        if node.get("type") == "tag":
            return
        if node.get("type") == "json_schema" and isinstance(node.get("json_schema"), dict):
            yield node["json_schema"]
            return
        for value in node.values():
            yield from _schemas_outside_tags(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schemas_outside_tags(value)


def tool_tag(tags: list[dict[str, Any]], name: str | None, *, forced: bool) -> dict[str, Any] | None:
    """The tag of the call to write: the named tool's (its name is in the tag's opening text), else
    the first when a call is forced, else none."""
    if name is not None:
        for tag in tags:
            if json.dumps(name) in tag["begin"]:
                return tag
    return tags[0] if forced and tags else None


def schema_value(schema: dict[str, Any]) -> Any:
    """A small value of a JSON schema: its required properties (all, where none are listed), the
    first of an enum or of `anyOf`/`oneOf`, and a fixed value of each type."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema_value(schema[key][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties") or {}
        names = schema.get("required") or list(properties)
        return {name: schema_value(properties.get(name) or {"type": "string"}) for name in names}
    if kind == "array":
        return [schema_value(schema["items"])] * schema.get("minItems", 0) if "items" in schema else []
    return {"string": "scripted", "integer": 1, "number": 1.5, "boolean": True, "null": None}.get(kind, "scripted")
