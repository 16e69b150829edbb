"""Counts the chat sockets a web process holds open (chatsite_live_sockets)."""

from __future__ import annotations

from typing import Any

from observability import metrics


class SocketsCounted:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        metrics.live_sockets.inc()
        try:
            return await self.app(scope, receive, send)
        finally:
            metrics.live_sockets.dec()
