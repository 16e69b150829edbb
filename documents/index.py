"""The chunk index: vector search, full-text search, and the two combined.

Every chunk row holds its embedding (float32 bytes), so the rows are the truth and deleting a
document, a conversation or a user deletes its chunks by the foreign keys' cascade. Beside them:

- vectors: on SQLite a sqlite-vec `vec0` table (`documents_chunk_vec`, the owner as its partition
  key, the document as a metadata column), kept in step with the rows by triggers; on PostgreSQL a
  pgvector table with an HNSW index where `CREATE EXTENSION vector` worked (migration 0002), its
  rows removed by the foreign key's cascade; anywhere else an exact scan: the owner's chunks in
  scope, their cosine similarity to the query computed with numpy. `vector_backend()` says which
  one this connection uses;
- words: SQLite's FTS5 (an external-content table over the chunk rows, kept by triggers) or
  PostgreSQL's full-text search (a stored generated `tsv` column, heading and text, GIN-indexed);
- hybrid: reciprocal rank fusion of the two rankings (k = 60, the constant of Cormack et al.).

Every search takes the owner and the documents in scope, and no query reads a chunk without both.
Chunks the prompt-injection check flagged are never returned (`injection = false`).
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from django.db import connection

from documents.models import Chunk
from documents.sqlite_extension import load_sqlite_vec

logger = logging.getLogger(__name__)

DIMENSIONS = 384
RRF_K = 60
VEC_TABLE = "documents_chunk_vec"
PGVECTOR_TABLE = "documents_chunk_pgvector"
FTS_TABLE = "documents_chunk_fts"
_WORD = re.compile(r"\w+", re.UNICODE)
# Words too common to help a full-text search find a passage (FTS5 keeps them; PostgreSQL's
# English configuration drops them itself).
STOP_WORDS = frozenset(
    "a an and are as at be by for from has have how in is it its of on or that the this to was what when where "
    "which who why will with do does did i you he she they we his her their our your me my".split()
)


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    score: float


def embedding_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def embedding_array(raw: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(bytes(raw), dtype="<f4")


# --- which vector search -------------------------------------------------------------------------


def vector_backend() -> str:
    """The vector search this connection uses: "sqlite-vec", "pgvector" or "exact"."""
    connection.ensure_connection()
    if connection.vendor == "sqlite":
        return "sqlite-vec" if getattr(connection, "sqlite_vec_ready", False) else "exact"
    if connection.vendor == "postgresql":
        return "pgvector" if pgvector_ready() else "exact"
    return "exact"


def pgvector_ready() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("select to_regclass(%s) is not null", [PGVECTOR_TABLE])
        return bool(cursor.fetchone()[0])


def sqlite_connection_prepare(raw: sqlite3.Connection) -> bool:
    """A new SQLite connection: load sqlite-vec and make sure its table and triggers mirror the
    chunk rows; True when vector search can use it. Without the extension, the triggers (which
    name the vec0 table, unusable then) are dropped so that deleting chunks still works; the next
    connection that has it finds them missing and brings the table back in step."""
    if raw.execute("select 1 from sqlite_master where name = 'documents_chunk'").fetchone() is None:
        return False  # not migrated yet
    if not load_sqlite_vec(raw):
        for suffix in ("ai", "ad"):
            raw.execute(f"drop trigger if exists {VEC_TABLE}_{suffix}")
        return False
    triggers = raw.execute(
        "select count(*) from sqlite_master where type = 'trigger' and name in (?, ?)",
        (f"{VEC_TABLE}_ai", f"{VEC_TABLE}_ad"),
    ).fetchone()[0]
    if triggers == 2:
        return True
    raw.execute(
        f"create virtual table if not exists {VEC_TABLE} using vec0(owner_id integer partition key, "
        f"document_id integer, embedding float[{DIMENSIONS}] distance_metric=cosine)"
    )
    raw.execute(
        f"create trigger if not exists {VEC_TABLE}_ai after insert on documents_chunk when new.injection = 0 begin "
        f"insert into {VEC_TABLE}(rowid, owner_id, document_id, embedding) "
        "values (new.id, new.owner_id, new.document_id, new.embedding); end"
    )
    raw.execute(
        f"create trigger if not exists {VEC_TABLE}_ad after delete on documents_chunk begin "
        f"delete from {VEC_TABLE} where rowid = old.id; end"
    )
    # Whatever changed while the triggers were away.
    raw.execute(f"delete from {VEC_TABLE} where rowid not in (select id from documents_chunk where injection = 0)")
    raw.execute(
        f"insert into {VEC_TABLE}(rowid, owner_id, document_id, embedding) select id, owner_id, document_id, embedding "
        f"from documents_chunk where injection = 0 and id not in (select rowid from {VEC_TABLE})"
    )
    return True


def pgvector_add(chunks: Sequence[tuple[int, int, int, bytes | memoryview]]) -> None:
    """Copy new chunks' vectors (id, owner, document, embedding) into the pgvector table, when it exists."""
    if connection.vendor != "postgresql" or not chunks or not pgvector_ready():
        return
    rows = [(cid, owner, doc, _pg_literal(emb)) for cid, owner, doc, emb in chunks]
    with connection.cursor() as cursor:
        cursor.executemany(
            f"insert into {PGVECTOR_TABLE} (chunk_id, owner_id, document_id, embedding) values (%s, %s, %s, %s::vector)",
            rows,
        )


def _pg_literal(raw: bytes | memoryview) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in embedding_array(raw)) + "]"


# --- searches ------------------------------------------------------------------------------------


def vector_search(*, owner_id: int, document_ids: Sequence[int], query: np.ndarray, limit: int) -> list[Hit]:
    """The `limit` chunks nearest to `query` (a unit vector) in the owner's `document_ids`, best first;
    the score is the cosine similarity."""
    if not document_ids:
        return []
    backend = vector_backend()
    if backend == "sqlite-vec":
        return _vector_sqlite_vec(owner_id, document_ids, query, limit)
    if backend == "pgvector":
        return _vector_pgvector(owner_id, document_ids, query, limit)
    return vector_search_exact(owner_id=owner_id, document_ids=document_ids, query=query, limit=limit)


def vector_search_exact(*, owner_id: int, document_ids: Sequence[int], query: np.ndarray, limit: int) -> list[Hit]:
    """Every chunk in scope compared with the query: needs no extension anywhere."""
    rows = list(
        Chunk.objects.filter(owner_id=owner_id, document_id__in=list(document_ids), injection=False).values_list(
            "id", "embedding"
        )
    )
    if not rows:
        return []
    matrix = np.frombuffer(b"".join(bytes(e) for _, e in rows), dtype="<f4").reshape(len(rows), -1)
    scores = matrix @ np.asarray(query, dtype=np.float32)
    best = np.argsort(-scores)[:limit]
    return [Hit(rows[i][0], float(scores[i])) for i in best]


def _vector_sqlite_vec(owner_id: int, document_ids: Sequence[int], query: np.ndarray, limit: int) -> list[Hit]:
    marks = ",".join("%s" for _ in document_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            f"select rowid, distance from {VEC_TABLE} where embedding match %s and k = %s and owner_id = %s "
            f"and document_id in ({marks}) order by distance",
            [embedding_bytes(query), limit, owner_id, *document_ids],
        )
        return [Hit(int(rowid), 1.0 - float(distance)) for rowid, distance in cursor.fetchall()]


def _vector_pgvector(owner_id: int, document_ids: Sequence[int], query: np.ndarray, limit: int) -> list[Hit]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"select chunk_id, 1 - (embedding <=> %s::vector) from {PGVECTOR_TABLE} "
            "where owner_id = %s and document_id = any(%s) order by embedding <=> %s::vector limit %s",
            [
                _pg_literal(embedding_bytes(query)),
                owner_id,
                list(document_ids),
                _pg_literal(embedding_bytes(query)),
                limit,
            ],
        )
        return [Hit(int(cid), float(score)) for cid, score in cursor.fetchall()]


def query_words(text: str) -> list[str]:
    words = [w.lower() for w in _WORD.findall(text)]
    return list(dict.fromkeys(w for w in words if w not in STOP_WORDS and len(w) > 1))[:32]


def fulltext_search(*, owner_id: int, document_ids: Sequence[int], text: str, limit: int) -> list[Hit]:
    """The `limit` chunks that best match any of the query's words, best first (BM25 on SQLite,
    ts_rank_cd on PostgreSQL)."""
    words = query_words(text)
    if not words or not document_ids:
        return []
    marks = ",".join("%s" for _ in document_ids)
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            match = " OR ".join('"' + w.replace('"', "") + '"' for w in words)
            cursor.execute(
                f"select c.id, -bm25({FTS_TABLE}) from {FTS_TABLE} join documents_chunk c on c.id = {FTS_TABLE}.rowid "
                f"where {FTS_TABLE} match %s and c.owner_id = %s and c.document_id in ({marks}) and c.injection = 0 "
                f"order by bm25({FTS_TABLE}) limit %s",
                [match, owner_id, *document_ids, limit],
            )
        else:
            query = " | ".join(re.sub(r"[^\w]", "", w) for w in words if re.sub(r"[^\w]", "", w))
            cursor.execute(
                "select id, ts_rank_cd(tsv, q) as rank from documents_chunk, "
                "to_tsquery('english', %s) q where tsv @@ q and owner_id = %s "
                f"and document_id in ({marks}) and not injection order by rank desc limit %s",
                [query, owner_id, *document_ids, limit],
            )
        return [Hit(int(cid), float(score)) for cid, score in cursor.fetchall()]


def fuse(rankings: Sequence[Sequence[Hit]], *, limit: int) -> list[Hit]:
    """Reciprocal rank fusion: each chunk scores the sum of 1 / (RRF_K + rank) over the rankings."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + 1.0 / (RRF_K + rank)
    best = sorted(scores.items(), key=lambda item: -item[1])[:limit]
    return [Hit(chunk_id, score) for chunk_id, score in best]


def hybrid_search(
    *, owner_id: int, document_ids: Sequence[int], text: str, query: np.ndarray, limit: int, depth: int = 20
) -> list[Hit]:
    """Vector and full-text rankings, `depth` deep each, fused; the best `limit`."""
    vectors = vector_search(owner_id=owner_id, document_ids=document_ids, query=query, limit=depth)
    words = fulltext_search(owner_id=owner_id, document_ids=document_ids, text=text, limit=depth)
    return fuse([vectors, words], limit=limit)
