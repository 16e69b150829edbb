"""The image and the compose stack, end to end: `make container-test` (minutes; not in `make test`).

Builds the CPU image, brings compose.yaml up with podman (or docker), signs up, chats over the
socket, kills the worker in the middle of an answer and checks the page is told, starts the worker
again and chats again, then tears everything down, volumes included.

Where no public registry is reachable (CHATSITE_BASE_IMAGE unset), the base image is built from
Debian's archive (deploy/base-image.sh), and PostgreSQL and Redis images from it
(deploy/offline/); a local CPU wheel of torch that pip finds (PIP_FIND_LINKS) and the machine's
extra CA certificates go into the build context, as the Makefile's install uses them.

    CONTAINER=docker|podman   the runtime (default: podman where installed)
    CHATSITE_BASE_IMAGE       a base image to build from instead of Debian's archive
    KEEP=1                    leave the stack up after the run (tear it down with `compose down -v`)
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import websockets
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "chatsite-container-test"
PORT = int(os.environ.get("CONTAINER_TEST_PORT", "8099"))
BASE = f"http://127.0.0.1:{PORT}"
DEPLOYMENT = "smollm2-135m"
IMAGE = "localhost/chatsite:cpu"
LONG_PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm, in at least ten paragraphs."


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(*command: str, check: bool = True, capture: bool = False, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=check, text=True, capture_output=capture, cwd=ROOT, **kwargs)


def runtime() -> str:
    chosen = os.environ.get("CONTAINER") or ("podman" if shutil.which("podman") else "docker")
    if not shutil.which(chosen):
        sys.exit("no container runtime: install podman (apt-get install podman buildah runc) or docker")
    if chosen == "podman" and "CONTAINERS_CONF" not in os.environ:
        # What podman needs on hosts whose limits or cgroups its defaults trip over (the file says).
        os.environ["CONTAINERS_CONF"] = str(ROOT / "deploy" / "podman" / "containers.conf")
    return chosen


def compose_command(engine: str) -> list[str]:
    if engine == "docker":
        return ["docker", "compose"]
    tool = shutil.which("podman-compose") or str(Path(sys.executable).with_name("podman-compose"))
    if not Path(tool).exists():
        sys.exit("podman-compose is not installed (the Makefile's container-test target installs it)")
    return [tool]


def context_extras() -> None:
    """The local torch CPU wheel and extra CA certificates, into the build context's folders."""
    for folder in filter(None, re.split(r"[\s]+", os.environ.get("PIP_FIND_LINKS", "") + " /opt/wheels")):
        for wheel in Path(folder).glob("torch-*+cpu-*.whl") if Path(folder).is_dir() else []:
            target = ROOT / "deploy" / "wheels" / wheel.name
            if not target.exists():
                shutil.copy2(wheel, target)
    for certificate in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy2(certificate, ROOT / "deploy" / "ca-certificates" / certificate.name)


def build(engine: str) -> dict[str, str]:
    """Build the images the stack runs; returns the compose variables naming them."""
    images = {"CHATSITE_IMAGE": IMAGE}
    base = os.environ.get("CHATSITE_BASE_IMAGE")
    network = ["--network=host"]
    if not base:
        base = "localhost/debian:bookworm"
        run("sh", "deploy/base-image.sh", base, env={**os.environ, "CONTAINER": engine})
        for name in ("postgres", "redis"):
            tag = f"localhost/chatsite-{name}:bookworm"
            say(f"building {tag} from {base}")
            run(
                engine,
                "build",
                *network,
                "--build-arg",
                f"BASE_IMAGE={base}",
                "-t",
                tag,
                "-f",
                f"deploy/offline/{name}.Containerfile",
                ".",
                capture=True,
            )
            images[f"{name.upper()}_IMAGE"] = tag
    if os.environ.get("CHATSITE_IMAGE"):
        images["CHATSITE_IMAGE"] = os.environ["CHATSITE_IMAGE"]
        say(f"using {images['CHATSITE_IMAGE']} as built (CHATSITE_IMAGE)")
        return images
    context_extras()
    say(f"building {IMAGE} from {base} (minutes)")
    started = time.monotonic()
    fmt = ["--format", "docker"] if engine == "podman" else []  # keeps the HEALTHCHECK
    run(engine, "build", *network, *fmt, "--build-arg", f"BASE_IMAGE={base}", "-t", IMAGE, "-f", "Containerfile", ".")
    size = run(engine, "image", "inspect", IMAGE, "--format", "{{.Size}}", capture=True).stdout.strip()
    say(f"built {IMAGE} in {time.monotonic() - started:.0f} s: {int(size) / 1e9:.2f} GB")
    return images


def fetch(opener: urllib.request.OpenerDirector, path: str, data: dict | None = None) -> tuple[int, str]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(BASE + path, data=body, headers={"Referer": BASE + path})
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_ready(timeout: float) -> float:
    started = time.monotonic()
    opener = urllib.request.build_opener()
    while time.monotonic() - started < timeout:
        try:
            if fetch(opener, "/readyz")[0] == 200:
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"{BASE}/readyz did not answer 200 within {timeout:.0f} s")


def sign_up() -> str:
    """A new account through the sign-up page; returns the session cookie."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    status, page = fetch(opener, "/accounts/signup/")
    assert status == 200, status
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    password = secrets.token_urlsafe(16)
    form = {
        "csrfmiddlewaretoken": token,
        "username": f"alice-{secrets.token_hex(3)}",
        "email": "",
        "password1": password,
        "password2": password,
    }
    status, page = fetch(opener, "/accounts/signup/", form)
    cookies = {cookie.name: cookie.value for cookie in jar}
    assert status == 200 and "sessionid" in cookies, f"sign-up failed ({status})"
    return f"sessionid={cookies['sessionid']}; csrftoken={cookies['csrftoken']}"


async def chat(cookie: str, prompt: str, *, on_first_text=None, timeout: float = 300) -> dict:
    """Send one message on a new socket and return how its answer ended (done or error)."""
    headers = {"Cookie": cookie, "Origin": BASE}
    async with websockets.connect(f"ws://127.0.0.1:{PORT}/ws/chat/", additional_headers=headers) as ws:
        await ws.send(
            json.dumps({"type": "message.send", "model": DEPLOYMENT, "content": prompt, "client_id": str(uuid.uuid4())})
        )
        text = ""
        async with asyncio.timeout(timeout):
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "generation.delta":
                    if not text and on_first_text is not None:
                        await on_first_text()
                    text += event.get("text", event.get("delta", ""))
                elif event["type"] in {"generation.done", "generation.error", "error"}:
                    return {**event, "text": text}


def service_container(engine: str, service: str) -> str:
    ids = run(
        engine,
        "ps",
        "-aq",
        "--filter",
        f"label=com.docker.compose.project={PROJECT}",
        "--filter",
        f"label=com.docker.compose.service={service}",
        capture=True,
    ).stdout.split()
    assert len(ids) == 1, (service, ids)
    return ids[0]


def healthy(engine: str, service: str, timeout: float) -> None:
    """Run the service's own health check until it passes (podman without systemd runs none itself)."""
    container, started = service_container(engine, service), time.monotonic()
    while run(engine, "healthcheck", "run", container, check=False, capture=True).returncode != 0:
        assert time.monotonic() - started < timeout, f"{service}'s health check did not pass in {timeout:.0f} s"
        time.sleep(2)
    say(f"{service}: health check passed")


def staged_up(engine: str, project: list[str], env: dict[str, str], folder: Path) -> list[str]:
    """compose.yaml's order by hand, for podman releases whose compose cannot wait on a health state
    (4.3: no health checks without systemd, and a dependency graph that fails on chains): the file
    without its depends_on, then its services in their dependencies' order, each health check run."""
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for service in spec["services"].values():
        service.pop("depends_on", None)
    staged = folder / "compose.yaml"
    staged.write_text(yaml.safe_dump(spec, sort_keys=False))
    project = [*project[:-1], str(staged)]
    run(*project, "up", "-d", "postgres", "redis", env=env, capture=True)
    healthy(engine, "postgres", 120)
    healthy(engine, "redis", 60)
    run(*project, "up", "-d", "migrate", env=env, capture=True)
    status = run(engine, "wait", service_container(engine, "migrate"), capture=True).stdout.strip()
    assert status == "0", f"the migration exited {status}"
    say("migrated")
    run(*project, "up", "-d", "web", "worker", "documents", env=env, capture=True)
    return project


async def conversation(engine: str) -> None:
    say(f"waiting for {BASE}/readyz (the worker loads its engine)")
    say(f"ready after {await asyncio.to_thread(wait_ready, 900):.0f} s")
    cookie = sign_up()
    say("signed up")
    first = await chat(cookie, "Say hello in one short sentence.")
    assert first["type"] == "generation.done" and first["text"].strip(), first
    say(f"answered: {first['text'].strip()[:80]!r}")

    worker = service_container(engine, "worker")
    killed = {}

    async def kill_worker() -> None:
        if not killed:
            killed["at"] = time.monotonic()
            await asyncio.to_thread(run, engine, "kill", "--signal", "KILL", worker, capture=True)
            say("killed the worker mid-answer")

    ended = await chat(cookie, LONG_PROMPT, on_first_text=kill_worker, timeout=120)
    assert killed, "the answer ended before its first text"
    assert ended["type"] == "generation.error" and ended["code"] == "worker_lost", ended
    say(f"the page was told after {time.monotonic() - killed['at']:.1f} s: {ended['code']}: {ended['message']}")

    run(engine, "start", worker, capture=True)
    say("started the worker again")
    say(f"ready again after {await asyncio.to_thread(wait_ready, 600):.0f} s")
    again = await chat(cookie, "Name three colours.")
    assert again["type"] == "generation.done" and again["text"].strip(), again
    say(f"answered again: {again['text'].strip()[:80]!r}")


def main() -> int:
    started = time.monotonic()
    engine = runtime()
    variables = build(engine)
    compose = compose_command(engine)
    with tempfile.TemporaryDirectory() as folder:
        env_file = Path(folder) / "env"
        env_file.write_text(
            (ROOT / ".env.example")
            .read_text()
            .replace("change-me", "REPLACE")
            .replace("WEB_PORT=8000", f"WEB_PORT={PORT}")
        )
        env_file.write_text(
            re.sub("REPLACE", lambda _: secrets.token_urlsafe(32).replace("-", "x"), env_file.read_text())
        )
        env = {**os.environ, **variables, "CHATSITE_ENV_FILE": str(env_file), "WEB_PORT": str(PORT)}
        env["POSTGRES_PASSWORD"] = re.search(r"^POSTGRES_PASSWORD=(.*)$", env_file.read_text(), re.M).group(1)
        project = [*compose, "-p", PROJECT, "-f", "compose.yaml"]
        try:
            say("compose up")
            up = time.monotonic()
            if engine == "podman":
                project = staged_up(engine, project, env, Path(folder))
            else:
                run(*project, "up", "-d", env=env)
            say(f"up in {time.monotonic() - up:.0f} s")
            asyncio.run(conversation(engine))
            if engine == "podman":
                for service in ("web", "worker", "documents"):
                    healthy(engine, service, 120)
            say(f"PASSED in {time.monotonic() - started:.0f} s")
            return 0
        except BaseException:
            run(*project, "logs", "--tail", "60", env=env, check=False)
            say(f"FAILED after {time.monotonic() - started:.0f} s")
            raise
        finally:
            if os.environ.get("KEEP") != "1":
                run(*project, "down", "-v", env=env, check=False, capture=True)
                say("torn down")


if __name__ == "__main__":
    sys.exit(main())
