"""The real ASGI app served by uvicorn on the test session's loop, for the official clients and the
browser."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mcp_server_serving() -> Iterator[str]:
    """The tests' MCP server (tests.helpers.mcp_server) over Streamable HTTP, in a process of its own;
    yields its address once it accepts connections."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.mcp_server", "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the test MCP server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
async def chat_server(engine, served_app):
    """uvicorn serving the real ASGI app on the test session's loop (so it shares the engine)."""
    yield await served_app.url()
    await served_app.quiet()


@pytest.fixture
async def server_without_engine(served_app):
    """uvicorn serving the real ASGI app on the test session's loop with no engine started: for
    requests answered or refused before one is needed (limits, validation), and for generations no
    engine runs (tests end them in the database themselves)."""
    yield await served_app.url()
    await served_app.quiet()


@pytest.fixture(scope="session")
async def served_app():
    """The process's one uvicorn server, started by the first test that asks for it and stopped at
    the run's end: a start and a stop cost about a third of a second (uvicorn's own pauses), after
    each of hundreds of tests. Each test leaves it as a stop would (`ServedApp.quiet`)."""
    served = ServedApp()
    yield served
    await served.stop()


class ServedApp:
    """The app served on loopback, and the test's connections ended after each test."""

    def __init__(self) -> None:
        self.server = None
        self.task: asyncio.Task | None = None
        self.port = 0

    async def url(self) -> str:
        if self.task is None or self.task.done():
            await self._start()
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self.server, self.task, self.port = await _server_started()

    async def quiet(self) -> None:
        """What a stop does to a test's connections, without closing the listening socket: each is
        asked to end (idle ones close, a request in progress closes after its response, a socket gets
        "service restart"), then every connection and request task is waited for, so that nothing a
        test began runs on into the next, or into its database's flush."""
        if self.server is None or self.task is None or self.task.done():
            return
        state = self.server.server_state
        for connection in list(state.connections):
            connection.shutdown()
        while state.connections or state.tasks:  # noqa: ASYNC110 - uvicorn offers no event to wait on
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self.server is None or self.task is None:
            return
        self.server.should_exit = True
        await self.task
        self.server, self.task = None, None


@contextlib.asynccontextmanager
async def _serving():
    """A server of its own, stopped after: for a test about what a server's start or stop does."""
    server, task, port = await _server_started()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def _server_started() -> tuple[Any, asyncio.Task, int]:
    """uvicorn serving the real ASGI app on a free loopback port, once it listens: the server, the
    task that runs it and the port."""
    import uvicorn

    from chatsite.asgi import application

    port = free_port()
    server = uvicorn.Server(
        # As `make run` serves (its WebSocket implementation among it): forwarded headers are the
        # application's to judge (chatsite/proxies.py).
        uvicorn.Config(
            application,
            host="127.0.0.1",
            port=port,
            lifespan="off",
            log_level="warning",
            proxy_headers=False,
            ws="websockets",
            ws_per_message_deflate=False,
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        if task.done():
            task.result()  # raises what stopped it
        await asyncio.sleep(0.01)
    return server, task, port
