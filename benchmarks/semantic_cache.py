"""The semantic response cache on a labelled query set: hit rate, wrong-hit rate and time saved.

Replays benchmarks/data/semantic_cache_queries.json (small, written by hand): each group's question
is asked first (a miss, its answer kept as the cache keeps one), then its paraphrases, which should
be answered from the cache, and its near misses (close wording, another meaning), which must not.
Every look-up is the service's own (orchestration.cache.cache_probe: the MiniLM embedding, the
key, the candidates from the database, moderation's judgement of an answer the first time it is
served), in one transaction of the local database that is rolled back at the end. Prints

  hit rate         paraphrases answered from the cache (by their own group's answer)
  wrong-hit rate   near misses answered from the cache, and paraphrases given another group's answer
  time saved       hits x the time an answer takes the engine, less every look-up's cost

and one line `RESULT hit_rate=… wrong_hit_rate=… lookup_p50_ms=… saved_s=…`. No engine runs: an
answer's time is `--answer-s` (by default 120 tokens at the default model's 19 tokens a second on
a 2-core CPU, shared/FACTS.md). `--similarity` overrides RESPONSE_CACHE_SIMILARITY, to pick it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.harness import django_setup, pct, result

QUERIES = Path(__file__).resolve().parent / "data" / "semantic_cache_queries.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--answer-s", type=float, default=120 / 19, help="an answer's time on the engine (s)")
    parser.add_argument("--similarity", type=float, default=None, help="the threshold (default: the setting)")


class _Rollback(Exception):
    pass


def run(args: argparse.Namespace) -> None:
    django_setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import transaction

    from accounts.models import User
    from inference.models import Generation, ModelDeployment
    from orchestration.cache import cache_probe

    if args.similarity is not None:
        settings.RESPONSE_CACHE_SIMILARITY = args.similarity
    call_command("migrate", verbosity=0)
    groups = json.loads(QUERIES.read_text())["groups"]
    sampling = {"temperature": 0.3, "top_p": 0.9, "repetition_penalty": 1.15}
    figures: dict[str, int] = {"same": 0, "hits": 0, "different": 0, "wrong": 0}
    lookups_ms: list[float] = []
    try:
        with transaction.atomic():
            user = User.objects.create(username="semantic-cache-benchmark")
            deployment = ModelDeployment.objects.create(
                name="semantic-cache-benchmark", model="SmolLM2-135M-Instruct", semantic_cache=True
            )

            def probe(text: str):
                started = time.perf_counter()
                found = cache_probe(
                    deployment=deployment,
                    system_prompt="",
                    user_text=text,
                    sampling=sampling,
                    max_tokens=512,
                    user_id=user.id,
                )
                lookups_ms.append((time.perf_counter() - started) * 1000)
                return found

            for n, group in enumerate(groups):
                first = probe(group["ask"])
                answer = f"Answer {n}: about {group['ask']}"
                generation = Generation.objects.create(
                    user=user,
                    deployment=deployment,
                    prompt_token_ids=[1],
                    status="complete",
                    finish_reason="stop",
                    text=answer,
                    completion_tokens=120,
                )
                first.keep(generation_id=generation.id)
            print(f"{'query':60} {'label':9} {'outcome':10} similarity")
            for n, group in enumerate(groups):
                for label in ("same", "different"):
                    for text in group[label]:
                        found = probe(text)
                        own = found.hit is not None and found.hit.text.startswith(f"Answer {n}:")
                        figures[label] += 1
                        if label == "same":
                            figures["hits"] += own
                            figures["wrong"] += found.hit is not None and not own
                        else:
                            figures["wrong"] += found.hit is not None
                        outcome = "hit" if own else ("wrong hit" if found.hit is not None else "miss")
                        print(f"{text[:60]:60} {label:9} {outcome:10} {found.similarity:.3f}")
            raise _Rollback
    except _Rollback:
        pass
    hit_rate = figures["hits"] / figures["same"]
    wrong_rate = figures["wrong"] / (figures["same"] + figures["different"])
    saved_s = figures["hits"] * args.answer_s - sum(lookups_ms) / 1000
    print(
        f"\nthreshold {settings.RESPONSE_CACHE_SIMILARITY}: hit rate {hit_rate:.0%} ({figures['hits']}/{figures['same']}), "
        f"wrong hits {wrong_rate:.0%} ({figures['wrong']}/{figures['same'] + figures['different']}), "
        f"look-up p50 {pct(lookups_ms, 50):.1f} ms p99 {pct(lookups_ms, 99):.1f} ms, "
        f"time saved {saved_s:.1f} s over {len(lookups_ms)} requests ({args.answer_s:.1f} s an answer)"
    )
    result(
        hit_rate=round(hit_rate, 3),
        wrong_hit_rate=round(wrong_rate, 3),
        lookup_p50_ms=round(pct(lookups_ms, 50), 1),
        lookup_p99_ms=round(pct(lookups_ms, 99), 1),
        saved_s=round(saved_s, 1),
    )
