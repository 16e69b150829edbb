"""Wait until the service's /readyz answers 200, and say so; with --watch, go on saying when it changes.

    python scripts/wait_ready.py http://127.0.0.1:8000/readyz [--timeout 300] [--watch]

`make topology` runs it beside the web process and the worker (Procfile, `ready`): it prints the
moment the service can take messages (database, Redis, broker, a ready engine for every enabled
deployment), then each change of readiness and the checks that failed. Deployment scripts use it
without --watch: it exits 0 once ready, 1 at the timeout. Only the standard library: it runs
anywhere. METRICS_TOKEN, when set, is sent for /readyz's details (docs/observability.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

PROBE_EVERY_S = 1.0
STILL_WAITING_EVERY_S = 15.0


def probe(url: str, token: str) -> tuple[bool, dict[str, Any]]:
    """(ready, the body's details) from one GET; unreachable is not ready."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            body = {}
        return False, body
    except (OSError, ValueError) as exc:
        return False, {"error": f"unreachable: {exc}"}


def failing(body: dict[str, Any]) -> str:
    """The failed checks, in a line: `engines: no ready engine for ...; redis: ConnectionError ...`."""
    checks = body.get("checks")
    if not checks:
        return body.get("error", "not ready")
    return "; ".join(f"{name}: {check.get('error', 'failed')}" for name, check in checks.items() if not check.get("ok"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the service's /readyz")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for ready (without --watch)")
    parser.add_argument("--watch", action="store_true", help="keep probing and print each change")
    args = parser.parse_args(argv)
    token = os.environ.get("METRICS_TOKEN", "")
    started = time.monotonic()
    was_ready: bool | None = None
    last_said = started
    while True:
        ready, body = probe(args.url, token)
        now = time.monotonic()
        if ready != was_ready:
            if ready:
                checks = body.get("checks", {})
                took = ", ".join(f"{name} {check.get('ms', '?')} ms" for name, check in checks.items())
                print(f"ready after {now - started:.0f} s: {args.url} ({took})", flush=True)
            elif was_ready:
                print(f"NOT READY: {failing(body)}", flush=True)
            was_ready, last_said = ready, now
        elif not ready and now - last_said >= STILL_WAITING_EVERY_S:
            print(f"waiting for ready ({now - started:.0f} s): {failing(body)}", flush=True)
            last_said = now
        if ready and not args.watch:
            return 0
        if not args.watch and now - started >= args.timeout:
            print(f"not ready after {args.timeout:.0f} s: {failing(body)}", file=sys.stderr, flush=True)
            return 1
        time.sleep(PROBE_EVERY_S)


if __name__ == "__main__":
    sys.exit(main())
