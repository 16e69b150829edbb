"""The full-text index (SQLite FTS5 or PostgreSQL's tsvector), pgvector where it can be created, and
the default tiers' file limits. sqlite-vec's table is created by each connection that loads it
(documents.index.sqlite_connection_prepare), since only such a connection can."""

from django.db import migrations

MB = 1024 * 1024
# name: (max file bytes, max files, max total bytes); None: no limit.
DEFAULT_LIMITS = {
    "free": (5 * MB, 20, 50 * MB),
    "pro": (25 * MB, 200, 1024 * MB),
    "enterprise": (100 * MB, None, None),
    "admin": (None, None, None),
}

SQLITE_FTS = [
    "create virtual table documents_chunk_fts using fts5(text, heading, content='documents_chunk', content_rowid='id')",
    "create trigger documents_chunk_fts_ai after insert on documents_chunk begin "
    "insert into documents_chunk_fts(rowid, text, heading) values (new.id, new.text, new.heading); end",
    "create trigger documents_chunk_fts_ad after delete on documents_chunk begin "
    "insert into documents_chunk_fts(documents_chunk_fts, rowid, text, heading) "
    "values ('delete', old.id, old.text, old.heading); end",
]
SQLITE_FTS_REVERSE = [
    "drop trigger if exists documents_chunk_fts_ai",
    "drop trigger if exists documents_chunk_fts_ad",
    "drop table if exists documents_chunk_fts",
]
POSTGRES_FTS = [
    # Stored, so a search ranks the matches without parsing their text again.
    "alter table documents_chunk add column tsv tsvector "
    "generated always as (to_tsvector('english', heading || ' ' || text)) stored",
    "create index documents_chunk_tsv on documents_chunk using gin (tsv)",
]
POSTGRES_VECTOR = [
    "create table documents_chunk_pgvector (chunk_id bigint primary key references documents_chunk (id) "
    "on delete cascade deferrable initially deferred, owner_id bigint not null, document_id bigint not null, "
    "embedding vector(384) not null)",
    "create index documents_chunk_pgvector_owner on documents_chunk_pgvector (owner_id, document_id)",
    "create index documents_chunk_pgvector_hnsw on documents_chunk_pgvector using hnsw (embedding vector_cosine_ops)",
]


def search_index_create(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for statement in SQLITE_FTS:
                cursor.execute(statement)
        elif connection.vendor == "postgresql":
            for statement in POSTGRES_FTS:
                cursor.execute(statement)
            # pgvector where the server has it; the exact scan otherwise (documents.index.vector_backend).
            cursor.execute("savepoint pgvector")
            try:
                cursor.execute("create extension if not exists vector")
                for statement in POSTGRES_VECTOR:
                    cursor.execute(statement)
                cursor.execute("release savepoint pgvector")
            except Exception:
                cursor.execute("rollback to savepoint pgvector")


def search_index_drop(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for statement in SQLITE_FTS_REVERSE:
                cursor.execute(statement)
        elif connection.vendor == "postgresql":
            cursor.execute("drop table if exists documents_chunk_pgvector")
            cursor.execute("drop index if exists documents_chunk_tsv")
            cursor.execute("alter table documents_chunk drop column if exists tsv")


def limits_create(apps, schema_editor):
    Tier = apps.get_model("accounts", "Tier")
    TierDocumentLimits = apps.get_model("documents", "TierDocumentLimits")
    for tier in Tier.objects.filter(name__in=DEFAULT_LIMITS):
        max_file_bytes, max_files, max_total_bytes = DEFAULT_LIMITS[tier.name]
        TierDocumentLimits.objects.get_or_create(
            tier=tier,
            defaults={"max_file_bytes": max_file_bytes, "max_files": max_files, "max_total_bytes": max_total_bytes},
        )


class Migration(migrations.Migration):
    dependencies = [
        ("documents", "0001_documents_chunks_citations_limits"),
        ("accounts", "0006_embedding_scope_usage_and_prices"),
    ]

    operations = [
        migrations.RunPython(search_index_create, search_index_drop),
        migrations.RunPython(limits_create, migrations.RunPython.noop),
    ]
