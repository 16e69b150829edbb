"""The capacity benchmark's stand-in for the engine: a token source, not a model.

    python -m benchmarks.token_source web --port P        # uvicorn serving the ASGI app
    python -m benchmarks.token_source worker --concurrency C --queue gpu.<deployment>

Each process hosts the service unchanged except for the engine: `inference.engine.host._build_engine`
returns a `TokenSource`, which answers every request with `max_tokens` tokens at a steady rate
(CAPACITY_TOKENS_PER_S, 25 by default), the first reading "[token source, not a model]" and each
one the wall-clock time it was made (`t` and tenths of a millisecond, modulo 10^9), so a client on
the same machine can tell how late each token reached it. What is measured is the service around
the engine: runner, channel layer, consumers, sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

TICKS_PER_S = 10_000
TICKS_MODULO = 10**9


def ticks_now() -> int:
    return int(time.time() * TICKS_PER_S) % TICKS_MODULO


class TokenSource:
    """What EngineHost asks of vLLM's AsyncLLM, answered without a model."""

    def __init__(self, spec: Any) -> None:
        self.rate = float(os.environ.get("CAPACITY_TOKENS_PER_S", "25"))
        self.model_config = SimpleNamespace(dtype="token-source")
        self._live: set[str] = set()
        # inference.engine.vllm_internals.unfinished_requests reads this (the heartbeat's count).
        self.output_processor = SimpleNamespace(get_num_unfinished_requests=lambda: len(self._live))

    async def generate(self, prompt: Any, params: Any, request_id: str, **kwargs: Any) -> AsyncIterator[Any]:
        count = params.max_tokens or 64
        started = time.monotonic()
        self._live.add(request_id)
        try:
            for i in range(count):
                # On a schedule, not after a sleep each: a late step does not push the rest back.
                await asyncio.sleep(max(0.0, started + (i + 1) / self.rate - time.monotonic()))
                last = i == count - 1
                text = f"{'[token source, not a model]' if i == 0 else ''} t{ticks_now()}"
                choice = SimpleNamespace(text=text, token_ids=[0], finish_reason="length" if last else None)
                yield SimpleNamespace(outputs=[choice], finished=last, prompt_token_ids=None)
        finally:
            self._live.discard(request_id)

    async def collective_rpc(self, *args: Any, **kwargs: Any) -> list[bool]:
        return [True]

    def shutdown(self) -> None:
        return None


def install() -> None:
    """Every engine this process builds is a token source."""
    import django

    django.setup()
    from inference.engine import host

    host._build_engine = TokenSource  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["web", "worker"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--queue", default="")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    sys.path.insert(0, os.getcwd())
    install()
    if args.role == "web":
        import uvicorn

        uvicorn.run(
            "chatsite.asgi:application", host="127.0.0.1", port=args.port, lifespan="on", ws="websockets",
            ws_per_message_deflate=False, log_level="warning",
        )  # fmt: skip
        return
    from chatsite.celery import app

    app.worker_main(
        ["worker", "-P", "threads", "-c", str(args.concurrency), "-Q", args.queue, "-n", f"capacity-{os.getpid()}@%h",
         "--without-gossip", "--without-mingle", "-l", "WARNING"]
    )  # fmt: skip


if __name__ == "__main__":
    main()
