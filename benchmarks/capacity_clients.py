"""The capacity benchmark's clients, in processes of their own so that their CPU is not the web
process's to share a core with (and not counted as the service's).

Each process runs the streams it is given on one event loop and answers its parent's commands over a
pipe: `grow` to N streams (answered once all of them stream), `report` the lags and tokens received
between two `time.monotonic()` instants (one clock for every process on the machine), `stop`.

A stream is one user's closed loop: a message, its answer followed to the end, the next. It speaks
one of the service's three streaming ways out:

- `ws`: the chat socket (`message.send`, `generation.delta` frames);
- `sse`: `POST /v1/chat/completions` with `stream: true` (OpenAI's chunks);
- `conversations`: `POST /api/conversations/messages/` (`event: delta`).

Every token of the token source carries the time it was made (`benchmarks/token_source.py`): a
token's lag is its arrival less that.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from benchmarks.token_source import TICKS_MODULO, TICKS_PER_S, ticks_now

TICK = re.compile(r"t(\d+)")
PROTOCOLS = ("ws", "sse", "conversations")


@dataclass(frozen=True)
class Target:
    """Where one stream goes and as whom: a web process's base URL and a session cookie (`ws`) or an
    API key (`sse`, `conversations`)."""

    base: str
    credential: str


class Stream:
    def __init__(self, target: Target, *, protocol: str, deployment: str) -> None:
        self.target, self.protocol, self.deployment = target, protocol, deployment
        self.lags_ms: list[tuple[float, float]] = []  # (when received, lag)
        self.streaming = asyncio.Event()
        self.errors = 0

    def _texts(self, text: str) -> None:
        now, received = ticks_now(), time.monotonic()
        for made in TICK.findall(text):
            self.lags_ms.append((received, ((now - int(made)) % TICKS_MODULO) / TICKS_PER_S * 1000))
        self.streaming.set()

    async def run(self) -> None:
        while True:
            try:
                await (self._socket() if self.protocol == "ws" else self._event_streams())
            except asyncio.CancelledError:
                raise
            except Exception:
                self.errors += 1
                await asyncio.sleep(1)

    async def _socket(self) -> None:
        import websockets

        url = self.target.base.replace("http://", "ws://") + "/ws/chat/"
        headers = {"Cookie": self.target.credential, "Origin": self.target.base}
        async with websockets.connect(url, additional_headers=headers, max_queue=None) as ws:
            await ws.recv()  # engine.status
            while True:
                frame = {"type": "message.send", "model": self.deployment, "content": "Stream please."}
                await ws.send(json.dumps({**frame, "client_id": str(uuid.uuid4())}))
                while True:
                    event = json.loads(await ws.recv())
                    kind = event["type"]
                    if kind == "generation.delta":
                        self._texts(event.get("text", ""))
                    elif kind == "generation.done":
                        break
                    elif kind in ("generation.error", "error"):
                        self.errors += 1
                        await asyncio.sleep(1)
                        break

    async def _event_streams(self) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.target.credential}"}
        if self.protocol == "sse":
            path = "/v1/chat/completions"
            body: dict[str, Any] = {
                "model": self.deployment,
                "messages": [{"role": "user", "content": "Stream please."}],
                "stream": True,
            }
        else:
            path, body = "/api/conversations/messages/", {"model": self.deployment, "content": "Stream please."}
        async with httpx.AsyncClient(base_url=self.target.base, headers=headers, timeout=120) as client:
            while True:
                async with client.stream("POST", path, json=body) as response:
                    if response.status_code != 200:
                        self.errors += 1
                        await asyncio.sleep(1)
                        continue
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        data = json.loads(line[6:])
                        if self.protocol == "sse":
                            for choice in data.get("choices", []):
                                self._texts((choice.get("delta") or {}).get("content") or "")
                        elif "text" in data and "seq" in data:
                            self._texts(data["text"])


async def _serve(conn: Connection, targets: list[Target], protocol: str, deployment: str) -> None:
    loop = asyncio.get_running_loop()
    streams: list[Stream] = []
    tasks: list[asyncio.Task] = []
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command[0] == "grow":
            while len(streams) < command[1]:
                stream = Stream(targets[len(streams)], protocol=protocol, deployment=deployment)
                streams.append(stream)
                tasks.append(asyncio.create_task(stream.run()))
            await asyncio.wait_for(asyncio.gather(*(s.streaming.wait() for s in streams)), timeout=180)
            conn.send(("streaming", len(streams)))
        elif command[0] == "report":
            began, ended = command[1], command[2]
            lags = [lag for s in streams for when, lag in s.lags_ms if began <= when <= ended]
            conn.send(("report", lags, sum(s.errors for s in streams)))
            for s in streams:  # what is reported is not kept
                s.lags_ms = [(when, lag) for when, lag in s.lags_ms if when > ended]
        else:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            conn.send(("stopped",))
            return


def client_process(conn: Connection, targets: list[Target], protocol: str, deployment: str) -> None:
    """A client process's body (multiprocessing, spawned)."""
    try:
        import uvloop

        uvloop.run(_serve(conn, targets, protocol, deployment))
    except ImportError:
        asyncio.run(_serve(conn, targets, protocol, deployment))
