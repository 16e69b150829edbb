"""Every HTTP request gets an id (kept from a sane X-Request-ID, else new), returned in the
X-Request-ID header; refusals (429, 503) are counted by channel, and answer streams while open."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

import chatsite.request_context as request_context
from observability import metrics, store

HEADER = "X-Request-ID"


def channel_of(path: str) -> str:
    if path.startswith("/v1/"):
        return "openai_api"
    if path.startswith("/api/conversations/"):
        return "conversations_api"
    return "page"


def _begin(request: HttpRequest) -> str:
    return request_context.request_begin(channel_name=channel_of(request.path), incoming_id=request.headers.get(HEADER))


def _after(response: HttpResponseBase, rid: str) -> HttpResponseBase:
    response[HEADER] = rid
    if response.status_code in (429, 503):
        code = ""
        if not response.streaming:
            try:
                code = str(json.loads(getattr(response, "content", b""))["error"]["code"] or "")
            except (ValueError, KeyError, TypeError):
                code = ""
        if metrics.refusal_observe(channel=request_context.channel.get(), status=response.status_code, code=code):
            store.sample_add({"k": "r", "o": "rate_limited" if response.status_code == 429 else "refused"})
    if response.streaming and response.get("Content-Type", "").startswith("text/event-stream"):
        _count_while_open(response)
    return response


def _count_while_open(response: Any) -> None:
    original = response.streaming_content
    if getattr(response, "is_async", False):

        async def counted_async() -> Any:
            metrics.live_streams.inc()
            try:
                async for chunk in original:
                    yield chunk
            finally:
                metrics.live_streams.dec()

        response.streaming_content = counted_async()
        return

    def counted() -> Any:
        metrics.live_streams.inc()
        try:
            yield from original
        finally:
            metrics.live_streams.dec()

    response.streaming_content = counted()


@sync_and_async_middleware
def request_observed(
    get_response: Callable[[HttpRequest], Any],
) -> Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]:
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponseBase:
            rid = _begin(request)
            return _after(await get_response(request), rid)

        return middleware_async

    def middleware(request: HttpRequest) -> HttpResponseBase:
        rid = _begin(request)
        return _after(get_response(request), rid)

    return middleware
