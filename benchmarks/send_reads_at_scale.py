"""What the reads every send makes cost once the service has history: the same reads against an
empty generation table and against one of many finished rows.

A send counts its deployment's queued generations (admission control), and a user on a plan with
token quotas adds up what their unfinished generations may still use. Both filter on a status that
only a handful of rows have at any moment, so they should cost the same however many finished
generations the table holds: the status index leads PostgreSQL to the unfinished rows alone.

In a scratch database (`<name>_scale`, created and dropped here; kept with `--keep`, to look at its
plans): each read p50 and p90 over 200 calls, a pause of 2 ms before each as between a send's
statements, on the empty table, then with `--rows` finished generations (500,000 by default) spread
over 1,000 users, one of them holding a tenth, and a few queued and running. Needs PostgreSQL:
`make benchmark-scale` (`python -m benchmarks scale`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.harness import django_setup, pct, result

USERS = 1000
CALLS = 200
PAUSE_S = 0.002


def scratch_database_url() -> tuple[str, str]:
    """(the scratch database's URL, a URL to the server's maintenance database)."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("Set DATABASE_URL to a PostgreSQL database: the scratch one is made beside it.")
    base, name = url.rsplit("/", 1)
    return f"{base}/{name}_scale", f"{base}/postgres"


def recreate(maintenance_url: str, name: str, *, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(maintenance_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if not drop_only:
            connection.execute(f'CREATE DATABASE "{name}"')


def fill(*, deployment_id: int, user_ids: list[int], heavy_user_id: int, rows: int) -> None:
    """`rows` finished generations and a few queued and running ones, written by the server itself."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO inference_generation (
                id, user_id, deployment_id, status, prompt_token_ids, sampling, priority, queue_priority,
                text, finish_reason, error_code, error_message, prompt_tokens, completion_tokens,
                stop_requested, awaiting_verdict, worker, created_at, started_at, finished_at
            )
            SELECT gen_random_uuid(),
                   CASE WHEN mod(i, 10) = 0 THEN %s ELSE (%s::bigint[])[1 + mod(i, %s)] END,
                   %s,
                   CASE WHEN mod(i, 3) = 0 THEN 'stopped' ELSE 'complete' END,
                   '[1, 2, 3]', '{"max_tokens": 64}', 0, 0, 'an answer', 'stop', '', '', 40, 64,
                   false, false, 'gpu@scale', now() - i * interval '1 second', now(), now()
            FROM generate_series(1, %s) AS i
            """,
            [heavy_user_id, user_ids, len(user_ids), deployment_id, rows],
        )
        cursor.execute(
            """
            INSERT INTO inference_generation (
                id, user_id, deployment_id, status, prompt_token_ids, sampling, priority, queue_priority,
                text, finish_reason, error_code, error_message, prompt_tokens, completion_tokens,
                stop_requested, awaiting_verdict, worker, created_at
            )
            SELECT gen_random_uuid(), (%s::bigint[])[1 + i], %s, CASE WHEN i < 3 THEN 'running' ELSE 'queued' END,
                   '[1, 2, 3]', '{"max_tokens": 64}', 0, 0, '', '', '', '', 40, 0, false, false, '', now()
            FROM generate_series(0, 7) AS i
            """,
            [user_ids, deployment_id],
        )
        cursor.execute("ANALYZE inference_generation")


def timed(read) -> tuple[float, float]:
    """(p50, p90) in ms of CALLS calls of `read`, each after a pause."""
    took = []
    for _ in range(CALLS):
        time.sleep(PAUSE_S)
        started = time.perf_counter()
        read()
        took.append((time.perf_counter() - started) * 1000)
    return pct(took, 50), pct(took, 90)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows",
        type=int,
        default=int(os.environ.get("BENCH_SCALE_ROWS", "500000")),
        help="finished generations to write (500,000)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        default=bool(os.environ.get("BENCH_SCALE_KEEP")),
        help="keep the scratch database",
    )


def run(args: argparse.Namespace) -> None:
    scratch_url, maintenance_url = scratch_database_url()
    name = scratch_url.rsplit("/", 1)[1]
    recreate(maintenance_url, name)
    os.environ["DATABASE_URL"] = scratch_url
    os.environ.pop("REDIS_URL", None)  # the reads alone: no broker, no channel layer
    try:
        measure(rows=args.rows)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            recreate(maintenance_url, name, drop_only=True)


def measure(*, rows: int) -> None:
    django_setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from inference.selectors import deployment_get, generation_queued_count, generation_tokens_reserved_for_user

    call_command("migrate", verbosity=0)
    deployment = deployment_get()
    User = get_user_model()
    User.objects.bulk_create(User(username=f"user{i}") for i in range(USERS))
    user_ids = list(User.objects.order_by("id").values_list("id", flat=True))
    heavy = User.objects.get(id=user_ids[0])
    reads = {
        "the deployment's queued count (every send)": lambda: generation_queued_count(deployment=deployment),
        "a user's unfinished generations (a send on a plan with quotas)": lambda: generation_tokens_reserved_for_user(
            user=heavy
        ),
    }
    empty = {label: timed(read) for label, read in reads.items()}
    started = time.perf_counter()
    fill(deployment_id=deployment.id, user_ids=user_ids, heavy_user_id=heavy.id, rows=rows)
    print(f"{rows:,} finished generations written in {time.perf_counter() - started:.0f} s")
    full = {label: timed(read) for label, read in reads.items()}
    for label in reads:
        (empty_p50, empty_p90), (p50, p90) = empty[label], full[label]
        print(
            f"{label}: {empty_p50:.2f} ms p50 ({empty_p90:.2f} p90) on the empty table; "
            f"{p50:.2f} ms ({p90:.2f}) with {rows:,} finished generations"
        )
    queued, reserved = reads
    result(
        rows=rows,
        queued_count_empty_p50_ms=round(empty[queued][0], 2),
        queued_count_full_p50_ms=round(full[queued][0], 2),
        unfinished_empty_p50_ms=round(empty[reserved][0], 2),
        unfinished_full_p50_ms=round(full[reserved][0], 2),
    )
