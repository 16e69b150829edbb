"""Forwarded headers are believed only from a proxy the operator names (chatsite/proxies.py), in the
application and in the command that serves it."""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.test import Client, RequestFactory

from accounts.services import LOGIN_FAILURES_PER_ADDRESS, LOGIN_PERIOD_S
from chatsite.origins import origin_allowed
from chatsite.proxies import client_address, request_forwarded_headers_resolve
from tests.helpers.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def proxies(settings):
    """Name the trusted proxies (addresses or networks), as DJANGO_TRUSTED_PROXIES does."""

    def name(*networks: str) -> None:
        settings.TRUSTED_PROXIES = [ipaddress.ip_network(n, strict=False) for n in networks]
        settings.TRUSTED_PROXY = True
        settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

    return name


def test_by_default_the_peer_is_the_client_whatever_it_forwards():
    assert not settings.TRUSTED_PROXY
    assert client_address(peer="127.0.0.1", forwarded_for="203.0.113.9") == "127.0.0.1"
    request = RequestFactory().get(
        "/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9", HTTP_X_FORWARDED_PROTO="https"
    )
    request_forwarded_headers_resolve(request)
    assert request.META["REMOTE_ADDR"] == "127.0.0.1"
    assert not request.is_secure()


def test_behind_a_named_proxy_the_client_is_the_first_address_that_is_not_a_proxy(proxies):
    proxies("127.0.0.1", "10.0.0.0/8")
    # What the client sent (198.51.100.1, spoofed) is left of what the proxies appended.
    forwarded = "198.51.100.1, 203.0.113.9, 10.1.2.3"
    assert client_address(peer="127.0.0.1", forwarded_for=forwarded) == "203.0.113.9"
    assert client_address(peer="::ffff:127.0.0.1", forwarded_for=forwarded) == "203.0.113.9"
    # A peer that is not one of them is the client, whatever it sends.
    assert client_address(peer="192.0.2.50", forwarded_for=forwarded) == "192.0.2.50"
    assert client_address(peer="127.0.0.1", forwarded_for="") == "127.0.0.1"

    request = RequestFactory().get(
        "/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9", HTTP_X_FORWARDED_PROTO="https"
    )
    request_forwarded_headers_resolve(request)
    assert request.META["REMOTE_ADDR"] == "203.0.113.9" and request.is_secure()
    direct = RequestFactory().get("/", REMOTE_ADDR="192.0.2.50", HTTP_X_FORWARDED_PROTO="https")
    request_forwarded_headers_resolve(direct)
    assert not direct.is_secure(), "a scheme header is believed from a named proxy only"


def test_behind_a_proxy_named_by_behind_proxy_alone_the_client_is_its_last_entry(settings):
    settings.TRUSTED_PROXY, settings.TRUSTED_PROXIES = True, []
    assert client_address(peer="10.9.9.9", forwarded_for="198.51.100.1, 203.0.113.9") == "203.0.113.9"


def test_a_sockets_scheme_header_counts_only_from_a_named_proxy(proxies, settings):
    proxies("10.0.0.1")
    settings.ALLOWED_HOSTS = ["chat.example.com"]
    headers = [
        (b"host", b"chat.example.com"),
        (b"origin", b"https://chat.example.com"),
        (b"x-forwarded-proto", b"https"),
    ]
    scope = {"type": "websocket", "scheme": "ws", "headers": headers}
    assert origin_allowed({**scope, "client": ("10.0.0.1", 50000)})
    assert not origin_allowed({**scope, "client": ("192.0.2.50", 50000)})


def _failed_sign_in(client: Client, forwarded_for: str):
    return client.post(
        "/accounts/login/",
        {"username": f"nobody-{uuid.uuid4().hex[:8]}", "password": "guess"},
        REMOTE_ADDR="127.0.0.1",
        HTTP_X_FORWARDED_FOR=forwarded_for,
    )


def test_by_default_a_rotating_forwarded_for_does_not_escape_the_sign_in_limit(db, monkeypatch):
    monkeypatch.setattr("accounts.ratelimit.time.time", lambda: 1_000_000.0)  # no refill meanwhile
    client = Client()
    for i in range(LOGIN_FAILURES_PER_ADDRESS):
        assert _failed_sign_in(client, f"198.51.100.{i}").status_code == 200
    assert _failed_sign_in(client, "198.51.100.250").status_code == 429


def test_behind_a_named_proxy_the_forwarded_address_is_the_one_limited(db, proxies, monkeypatch):
    monkeypatch.setattr("accounts.ratelimit.time.time", lambda: 1_000_000.0)
    proxies("127.0.0.1")
    client = Client()
    for _ in range(LOGIN_FAILURES_PER_ADDRESS):
        assert _failed_sign_in(client, "203.0.113.9").status_code == 200
    assert _failed_sign_in(client, "203.0.113.9").status_code == 429
    assert _failed_sign_in(client, "198.51.100.7").status_code == 200, "another client behind the proxy is not"


# --- the command that serves it -------------------------------------------------------------------


def _uvicorn_options(line: str) -> str:
    return re.sub(r"\s+", " ", line.split("chatsite.asgi:application", 1)[1]).strip()


def _makefile_run_command() -> str:
    recipe = (ROOT / "Makefile").read_text().split("\nrun:", 1)[1]
    return next(line.strip() for line in recipe.splitlines() if "uvicorn chatsite.asgi:application" in line)


def test_the_procfile_serves_with_the_options_of_make_run():
    procfile = next(line for line in (ROOT / "Procfile").read_text().splitlines() if line.startswith("web:"))
    procfile = procfile.replace("${HOST:-127.0.0.1}", "$(HOST)").replace("${PORT:-8000}", "$(PORT)")
    assert "--no-proxy-headers" in _makefile_run_command()
    assert _uvicorn_options(procfile) == _uvicorn_options(_makefile_run_command())


def _database_url() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    return (
        f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    )


@pytest.mark.django_db(transaction=True)
def test_make_runs_server_does_not_let_a_rotating_forwarded_for_escape_the_sign_in_limit(tmp_path):
    """uvicorn started with make run's own command line, on a loopback port, with no engine to load:
    every failed sign-in from this (loopback) client counts against one address, whatever
    X-Forwarded-For it sends. uvicorn's default would believe the header from loopback."""
    port = free_port()
    command = (
        _makefile_run_command()
        .replace("$(VENV)", str(Path(sys.executable).parent.parent))
        .replace("$(HOST)", "127.0.0.1")
        .replace("$(PORT)", str(port))
    )
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_BEHIND_PROXY", "DJANGO_TRUSTED_PROXIES"}}
    env |= {
        "DATABASE_URL": _database_url(),
        "CHATSITE_LOCAL_SECRET": "1",
        "CHATSITE_DATA_DIR": str(tmp_path),
        "INFERENCE_LOCAL_DEPLOYMENTS": "",  # nothing to load: sign-in needs no engine
    }
    log = open(tmp_path / "web.log", "wb")  # noqa: SIM115 - the process holds it
    process = subprocess.Popen(shlex.split(command), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 120
            while True:
                assert process.poll() is None, (tmp_path / "web.log").read_text()
                try:
                    client.get("/accounts/login/")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.3)
            statuses, began = [], time.monotonic()
            while 429 not in statuses and len(statuses) < LOGIN_FAILURES_PER_ADDRESS + 5:
                response = client.post(
                    "/accounts/login/",
                    data={
                        "username": f"nobody{len(statuses)}",
                        "password": "guess",
                        "csrfmiddlewaretoken": client.cookies["csrftoken"],
                    },
                    headers={"X-Forwarded-For": f"198.51.100.{len(statuses)}"},
                )
                statuses.append(response.status_code)
        # The bucket refills one attempt every LOGIN_PERIOD_S / LOGIN_FAILURES_PER_ADDRESS: a slow
        # machine may earn one more before the refusal, never an escape.
        refilled = int((time.monotonic() - began) // (LOGIN_PERIOD_S / LOGIN_FAILURES_PER_ADDRESS))
        assert 429 in statuses, statuses
        assert statuses.index(429) <= LOGIN_FAILURES_PER_ADDRESS + refilled, statuses
        assert set(statuses[:-1]) == {200}, statuses
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
