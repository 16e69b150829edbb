"""How soon a chat message's first text comes back in the embedded default (`make run`).

Starts the embedded server (uvicorn, SQLite, the engine in the web process) on a database of its
own in a temporary folder, signs a user in, opens the chat socket as the page does, and sends the
stack benchmark's prompts one after another, each into a new conversation, half a second apart.
Each answer is stopped at its first text, so the figure is the path to the first token (the send's
transaction, the input check, the claim, the engine's first step, the way back) and not the answer.
Prints the time from the send to the first text, p50 and p90, over `--messages` messages after three
to warm up. No PostgreSQL or Redis: `make benchmark-embedded`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, django_setup, pct, result
from benchmarks.stack import PROMPTS

WARM_UP = 3
PAUSE_S = 0.5


def signed_in_session() -> str:
    """A user on the plan with the highest limits, signed in: the session cookie's value."""
    django_setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from accounts.models import Tier
    from accounts.services import user_set_tier

    call_command("migrate", verbosity=0)
    user, _ = get_user_model().objects.get_or_create(username="benchmark-embedded")
    user_set_tier(user=user, tier=Tier.objects.get(name="admin"))
    client = Client()
    client.force_login(user)  # as the stack benchmark signs its user in
    connection.close()
    return client.cookies["sessionid"].value


async def measure(server: subprocess.Popen, port: int, session_key: str, messages: int) -> list[float]:
    import websockets

    deadline = time.monotonic() + 300
    while True:
        try:
            socket = await websockets.connect(
                f"ws://localhost:{port}/ws/chat/",
                origin=f"http://localhost:{port}",
                additional_headers={"Cookie": f"sessionid={session_key}"},
            )
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit("the server did not start; see its log")
            await asyncio.sleep(0.5)
    while True:  # the page can send at once, but the figure is the engine's, not its loading
        event = json.loads(await socket.recv())
        if event["type"] == "engine.status" and event["state"] == "ready":
            break
    took = []
    for i in range(messages + WARM_UP):
        await asyncio.sleep(PAUSE_S)
        sent = time.perf_counter()
        await socket.send(json.dumps({"type": "message.send", "content": PROMPTS[i % len(PROMPTS)]}))
        first = None
        while True:
            event = json.loads(await socket.recv())
            if event["type"] == "generation.delta" and first is None:
                first = time.perf_counter() - sent
                await socket.send(json.dumps({"type": "generation.stop", "generation": event["generation"]}))
            if event["type"] in ("generation.done", "generation.error", "message.blocked", "error"):
                if event["type"] != "generation.done" or first is None:
                    sys.exit(f"message {i} ended without text: {event}")
                break
        if i >= WARM_UP:
            took.append(first * 1000)
    await socket.close()
    return took


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=30, help="messages timed (30)")
    parser.add_argument("--port", type=int, default=8765, help="the embedded server's port (8765)")


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="chatsite-benchmark-") as data_dir:
        os.environ.update(
            CHATSITE_DATA_DIR=data_dir,
            INFERENCE_MODELS_DIR=os.environ.get("INFERENCE_MODELS_DIR", str(ROOT / "var" / "models")),
            DJANGO_SETTINGS_MODULE="chatsite.settings",
        )
        for name in ("DATABASE_URL", "REDIS_URL"):  # the embedded default, whatever the shell has
            os.environ.pop(name, None)
        session_key = signed_in_session()
        log = Path(data_dir) / "server.log"
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "chatsite.asgi:application", "--port", str(args.port)]
            + ["--lifespan", "on", "--ws", "websockets", "--ws-per-message-deflate", "false", "--log-level", "warning"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
        )
        try:
            took = sorted(asyncio.run(measure(server, args.port, session_key, args.messages)))
        except BaseException:
            print(log.read_text()[-4000:], file=sys.stderr)  # the server's own account of what went wrong
            raise
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(
        f"embedded default, the send to its first text: p50 {statistics.median(took):.1f} ms,"
        f" p90 {pct(took, 90):.1f} ms"
    )
    print(f"({len(took)} messages, each into a new conversation, {PAUSE_S} s apart)")
    result(first_text_p50_ms=round(statistics.median(took), 1), first_text_p90_ms=round(pct(took, 90), 1))
