"""Which request the current code works for: its id and the channel it came through.

The id is set where a request enters (observability's middleware for HTTP, the chat socket for each
message it is sent), travels with the Celery task that runs its generation (task headers), and is
read by the log filter (chatsite/logs.py) and the metrics. It lives in context variables, so every
coroutine and every thread that asgiref starts for the request sees it; a task started in an empty
context on purpose (the runner's) is given these variables only (`carried`).
"""

from __future__ import annotations

import contextvars
import re
import uuid
from collections.abc import Callable

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
# Where the request came from: "chat" (the chat page's socket), "conversations_api", "openai_api",
# "page" (anything else), or "" outside a request (a worker's own work, a command).
channel: contextvars.ContextVar[str] = contextvars.ContextVar("channel", default="")

# An incoming X-Request-ID is kept when it is this sane: short, and only characters that cannot
# break a log line or a header (a proxy's UUID, a trace id); anything else is replaced.
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_CARRIED = (request_id, channel)
# What else a carried context takes along: each entry, called in the caller's context, returns a
# function that puts it back in the new one (observability/tracing.py adds the current trace there).
_carriers: list[Callable[[], Callable[[], object]]] = []


def carry_also(capture: Callable[[], Callable[[], object]]) -> None:
    """Have `carried` contexts take along what `capture` reads from the caller's context."""
    if capture not in _carriers:
        _carriers.append(capture)


def carry_no_more(capture: Callable[[], Callable[[], object]]) -> None:
    if capture in _carriers:
        _carriers.remove(capture)


def request_id_new(incoming: str | None = None) -> str:
    """`incoming` when it is a sane id, else a fresh one."""
    if incoming and _SANE_ID.fullmatch(incoming):
        return incoming
    return uuid.uuid4().hex


def request_begin(*, channel_name: str, incoming_id: str | None = None) -> str:
    """Mark the current context as serving a new request; returns its id."""
    rid = request_id_new(incoming_id)
    request_id.set(rid)
    channel.set(channel_name)
    return rid


def carried() -> contextvars.Context:
    """A fresh context holding only the request's variables: for tasks that must not inherit the
    rest of the caller's context (see inference.execution.runner.Runner.submit_threadsafe)."""
    values = [(var, var.get()) for var in _CARRIED]
    restores = [capture() for capture in _carriers]

    def restore() -> None:
        for var, value in values:
            var.set(value)
        for put_back in restores:
            put_back()

    context = contextvars.Context()
    context.run(restore)
    return context


def headers() -> dict[str, str]:
    """The request's variables as task headers (empty outside a request)."""
    rid = request_id.get()
    return {"request_id": rid, "request_channel": channel.get()} if rid else {}
