"""Static files come from the ASGI application itself, streamed asynchronously.

The web process runs under uvicorn with no separate file server. A file response with a
synchronous iterator makes Django read the whole file in a thread and warn on every request
("StreamingHttpResponse must consume synchronous iterators"); these tests call the project's ASGI
application as uvicorn does and fail on that warning.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


async def asgi_get(path: str, headers: list[tuple[bytes, bytes]] = ()) -> tuple[int, dict[bytes, bytes], bytes]:
    from chatsite.asgi import application

    messages: list[dict] = []
    requested = asyncio.Event()

    async def receive() -> dict:
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected

    async def send(message: dict) -> None:
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"localhost"), *headers],
        "server": ("localhost", 80),
        "client": ("127.0.0.1", 50000),
    }
    await application(scope, receive, send)
    start = messages[0]
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], {name.lower(): value for name, value in start["headers"]}, body


async def test_a_static_file_is_served_whole_without_a_synchronous_iterator_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, headers, body = await asgi_get("/static/chat.js")
    assert status == 200
    assert body == (ROOT / "static" / "chat.js").read_bytes()
    assert headers[b"content-type"].startswith(b"text/javascript")
    assert not [w for w in caught if "synchronous iterators" in str(w.message)]


async def test_a_static_file_the_browser_has_is_not_sent_again():
    _, headers, _ = await asgi_get("/static/chat.css")
    status, _, body = await asgi_get("/static/chat.css", headers=[(b"if-none-match", headers[b"etag"])])
    assert status == 304
    assert body == b""


@pytest.mark.parametrize("path", ["/static/missing.js", "/static/../chatsite/settings.py"])
async def test_a_path_outside_the_static_files_is_not_found(path):
    status, _, body = await asgi_get(path)
    assert status == 404
    assert b"SECRET" not in body
