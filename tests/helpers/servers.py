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
async def chat_server(engine):
    """uvicorn serving the real ASGI app on the test session's loop (so it shares the engine)."""
    async with _serving() as url:
        yield url


@pytest.fixture
async def server_without_engine():
    """uvicorn serving the real ASGI app on the test session's loop with no engine started: for
    requests answered or refused before one is needed (limits, validation), and for generations no
    engine runs (tests end them in the database themselves)."""
    async with _serving() as url:
        yield url


@contextlib.asynccontextmanager
async def _serving():
    import uvicorn

    from chatsite.asgi import application

    port = free_port()
    server = uvicorn.Server(
        # As `make run` serves: forwarded headers are the application's to judge (chatsite/proxies.py).
        uvicorn.Config(
            application, host="127.0.0.1", port=port, lifespan="off", log_level="warning", proxy_headers=False
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
