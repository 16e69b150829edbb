"""From a completion's generation streams to its OpenAI response: one loop for every `/v1` completion.

A completion (chat or text, `n` choices) is `n` generations, each streamed on the channel layer. The
loop here follows them (`follow_streams`, stopping them if the response is abandoned) and hands what
it hears to a `ResponseShape`, which makes the endpoint's wire shapes from `wire`: `ChatShape` for
`/v1/chat/completions`, `TextShape` for `/v1/completions`. Streamed, each step becomes SSE chunks;
whole, the steps are collected into one body. A failed choice, a timeout or a restart end the
response with OpenAI's error shape (an error chunk, or a JSON error with its status).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.http import JsonResponse

from inference.openai import wire
from inference.openai.tools import ToolCallReader
from inference.streaming.following import FOLLOW_TIMEOUT_MESSAGE, follow_streams, stopped_if_abandoned
from inference.streaming.streams import ServerRestarting

SERVER_RESTARTING_MESSAGE = "The server is restarting. Try the request again."


@dataclass
class Choice:
    """One choice so far: the text passed on (streamed) or collected (whole), its tokens' log
    probabilities when they were asked for, how many chunks it has sent, and how it ended."""

    text: str = ""
    tokens: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0
    reason: str = "stop"


class ResponseShape(Protocol):
    """How one endpoint's completions look on the wire (every dict made by `wire`)."""

    def text_chunks(
        self, index: int, choice: Choice, text: str, tokens: list[dict[str, Any]], *, finished: bool = False
    ) -> list[dict[str, Any]]:
        """The chunks (one, or none while a tool call is read) that stream `text` (with `tokens`)
        after what `choice` has sent."""
        ...

    def end_chunks(self, index: int, choice: Choice, rest: str, reason: str) -> list[dict[str, Any]]:
        """The chunks that end a streamed choice: `rest` (text its deltas did not carry), its reason."""
        ...

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]: ...

    def whole(self, choices: list[Choice], usage: dict[str, int]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Completion:
    """What every chunk and body of one completion names, and what its request asked to be told."""

    completion_id: str
    created: int
    model: str
    include_usage: bool = False
    logprobs: bool = False


@dataclass(frozen=True)
class ChatShape(Completion):
    """`chat.completion` and its chunks. A choice's role goes out with its first text, not before
    prefill: a client timing its first token times the answer's, as from OpenAI and vLLM."""

    # Each choice's reader of tool calls, where the request has tools to call.
    readers: list[ToolCallReader] | None = None
    # Played back from the response cache: every body says so (`"cached": true`).
    cached: bool = False

    def _marked(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "cached": True} if self.cached else body

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        return self._marked(
            wire.chunk(
                completion_id=self.completion_id,
                created=self.created,
                model=self.model,
                choices=[choice],
                include_usage=self.include_usage,
            )
        )

    def text_chunks(
        self, index: int, choice: Choice, text: str, tokens: list[dict[str, Any]], *, finished: bool = False
    ) -> list[dict[str, Any]]:
        content: str | None = text
        tool_calls: list[dict[str, Any]] | None = None
        if self.readers is not None:
            # The reader keeps back what may be a tool call until it can tell, so a delta may make
            # no chunk, or a chunk of calls with no content.
            content, tool_calls = self.readers[index].delta(text, finished=finished)
            if content is None and not tool_calls:
                return [self._text(index, choice, "", None, tokens)] if finished and not choice.chunks else []
        elif finished and not text and choice.chunks:
            return []
        return [self._text(index, choice, content, tool_calls or None, tokens)]

    def _text(
        self,
        index: int,
        choice: Choice,
        content: str | None,
        tool_calls: list[dict[str, Any]] | None,
        tokens: list[dict[str, Any]],
    ) -> dict[str, Any]:
        role = None if choice.chunks else "assistant"
        logprobs = wire.chat_logprobs(tokens) if self.logprobs else None
        return self._chunk(
            wire.delta_choice(index, role=role, content=content, tool_calls=tool_calls, logprobs=logprobs)
        )

    def end_chunks(self, index: int, choice: Choice, rest: str, reason: str) -> list[dict[str, Any]]:
        chunks = self.text_chunks(index, choice, rest, [], finished=True)
        finish = self.readers[index].finish_reason(reason) if self.readers is not None else reason
        return [*chunks, self._chunk(wire.delta_choice(index, finish=finish))]

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return self._marked(
            wire.chunk(
                completion_id=self.completion_id,
                created=self.created,
                model=self.model,
                choices=[],
                usage=usage,
                include_usage=True,
            )
        )

    def whole(self, choices: list[Choice], usage: dict[str, int]) -> dict[str, Any]:
        texts: list[str | None] = [c.text for c in choices]
        reasons = [c.reason for c in choices]
        tool_calls = None
        if self.readers is not None:
            read = [reader.complete(c.text) for reader, c in zip(self.readers, choices, strict=True)]
            texts, tool_calls = [content for content, _ in read], [calls for _, calls in read]
            reasons = [reader.finish_reason(r) for reader, r in zip(self.readers, reasons, strict=True)]
        body = wire.completion(
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
            texts=texts,
            reasons=reasons,
            usage=usage,
            tool_calls=tool_calls,
            logprobs=[wire.chat_logprobs(c.tokens) for c in choices] if self.logprobs else None,
        )
        return self._marked(body)


@dataclass(frozen=True)
class TextShape(Completion):
    """`text_completion` and its chunks (legacy completions): text and reason in one chunk."""

    def _body(self, choices: list[dict[str, Any]], **usage: Any) -> dict[str, Any]:
        return wire.text_completion(
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
            choices=choices,
            include_usage=self.include_usage or bool(usage),
            **usage,
        )

    def _logprobs(self, choice: Choice, tokens: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return wire.text_logprobs(tokens, offset=sum(len(t["token"]) for t in choice.tokens))

    def text_chunks(
        self, index: int, choice: Choice, text: str, tokens: list[dict[str, Any]], *, finished: bool = False
    ) -> list[dict[str, Any]]:
        return [self._body([wire.text_choice(index, text, logprobs=self._logprobs(choice, tokens))])]

    def end_chunks(self, index: int, choice: Choice, rest: str, reason: str) -> list[dict[str, Any]]:
        return [self._body([wire.text_choice(index, rest, reason, logprobs=self._logprobs(choice, []))])]

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return self._body([], usage=usage)

    def whole(self, choices: list[Choice], usage: dict[str, int]) -> dict[str, Any]:
        return self._body(
            [
                wire.text_choice(i, c.text, c.reason, logprobs=wire.text_logprobs(c.tokens) if self.logprobs else None)
                for i, c in enumerate(choices)
            ],
            usage=usage,
        )


class ResponseFailed(Exception):
    """The response ends in an error: `body` in OpenAI's error shape, `status` for a whole one."""

    def __init__(self, body: dict[str, Any], status: int) -> None:
        super().__init__(body)
        self.body = body
        self.status = status


@dataclass(frozen=True)
class Step:
    """What one event of a choice's stream says: new text (and its tokens), or its end."""

    index: int
    text: str = ""
    tokens: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False
    # An end's text when it carries one: a content filter's cut, or the whole answer when the end
    # came from its row (`ends_from_rows`).
    whole: str | None = None
    reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)


async def _steps(ids: list[str]) -> AsyncGenerator[Step]:
    """The steps of the generations `ids` (choice i is `ids[i]`), until every one has ended.

    Raises ResponseFailed when a choice fails (the others are stopped), when nothing comes for the
    follow timeout, or when this process restarts (its answers are stopped and charged for what they
    generated, as when the client goes away: an OpenAI stream cannot be resumed)."""
    index = {generation_id: i for i, generation_id in enumerate(ids)}
    try:
        async with stopped_if_abandoned(ids) as following, aclosing(follow_streams(ids)) as events:
            async for event in events:
                i = index[event["generation"]]
                if event["type"] == "generation.delta":
                    yield Step(i, text=event["text"], tokens=event.get("logprobs") or [])
                elif event["type"] == "generation.done":
                    yield Step(
                        i,
                        ended=True,
                        whole=event.get("text"),
                        reason=wire.finish_reason(event.get("finish_reason")),
                        usage=event.get("usage") or {},
                    )
                else:
                    raise ResponseFailed(_failure_body(event), 500)
            following.ended = True
    except TimeoutError:
        raise ResponseFailed(wire.error_body(message=FOLLOW_TIMEOUT_MESSAGE, status=504, code="timeout"), 504) from None
    except ServerRestarting:
        body = wire.error_body(message=SERVER_RESTARTING_MESSAGE, status=503, code="server_restarting")
        raise ResponseFailed(body, 503) from None


async def streamed(ids: list[str], shape: ResponseShape, *, include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE body of a streamed completion: its chunks, the usage chunk when asked, `[DONE]`; or,
    when it fails, an `{"error": ...}` chunk and no `[DONE]`."""
    choices = [Choice() for _ in ids]
    usage = wire.usage(0, 0)
    try:
        async with aclosing(_steps(ids)) as steps:
            async for step in steps:
                choice = choices[step.index]
                if not step.ended:
                    bodies = shape.text_chunks(step.index, choice, step.text, step.tokens)
                    choice.text += step.text
                    choice.tokens += step.tokens
                    for body in bodies:
                        yield wire.sse(body)
                        choice.chunks += 1
                    continue
                for body in shape.end_chunks(step.index, choice, _unsent(choice.text, step.whole), step.reason):
                    yield wire.sse(body)
                    choice.chunks += 1
                usage = _add_usage(usage, step.usage, first=step.index == 0)
    except ResponseFailed as failed:
        yield wire.sse(failed.body)
        return
    if include_usage:
        yield wire.sse(shape.usage_chunk(usage))
    yield wire.sse("[DONE]")


async def whole(ids: list[str], shape: ResponseShape) -> JsonResponse:
    """The whole completion once every choice has ended, or the error that ended it."""
    choices = [Choice() for _ in ids]
    usage = wire.usage(0, 0)
    try:
        async with aclosing(_steps(ids)) as steps:
            async for step in steps:
                choice = choices[step.index]
                if not step.ended:
                    choice.text += step.text
                    choice.tokens += step.tokens
                    continue
                # The text an end carries replaces the deltas' (a cut keeps only the tokens it kept).
                if step.whole is not None:
                    choice.text = step.whole
                    choice.tokens = _tokens_within(choice.tokens, len(step.whole))
                choice.reason = step.reason
                usage = _add_usage(usage, step.usage, first=step.index == 0)
    except ResponseFailed as failed:
        return JsonResponse(failed.body, status=failed.status)
    return JsonResponse(shape.whole(choices, usage))


def _unsent(sent: str, whole: str | None) -> str:
    """What of `whole`, an answer's text as its `done` gives it, the deltas have not sent: nothing
    when it is not a continuation of what they sent (a cut cannot take back what a stream sent)."""
    if whole is None or not whole.startswith(sent):
        return ""
    return whole[len(sent) :]


def _tokens_within(tokens: list[dict[str, Any]], length: int) -> list[dict[str, Any]]:
    """The first of `tokens` whose text fits in `length` characters."""
    kept, used = [], 0
    for token in tokens:
        used += len(token["token"])
        if used > length:
            break
        kept.append(token)
    return kept


def _failure_body(event: dict[str, Any]) -> dict[str, Any]:
    return wire.error_body(message=event.get("message", "The generation failed."), status=500, code=event.get("code"))


def _add_usage(total: dict[str, Any], usage: dict[str, Any], *, first: bool) -> dict[str, Any]:
    """n choices share one prompt: count its tokens (and those of it the cache served) once, every
    choice's completion."""
    prompt = usage.get("prompt_tokens", 0) if first else 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) if first else 0
    return wire.usage(
        total["prompt_tokens"] + prompt,
        total["completion_tokens"] + usage.get("completion_tokens", 0),
        total["prompt_tokens_details"]["cached_tokens"] + cached,
    )
