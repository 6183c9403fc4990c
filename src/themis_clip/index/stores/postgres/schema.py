"""The PostgreSQL store's schema and its migrations, the pgvector checks, and URLs without
passwords (:mod:`.store` runs them).

Schema (tables ``themis_*`` in the connection's current schema, the first of its search path
that exists; several collections in one database: ``?options=-csearch_path%3Dname``),
versioned in ``themis_meta.schema_version`` and migrated under an advisory lock, each
migration in one transaction::

    themis_meta(key PRIMARY KEY, value)        model_id, model_sha256, dim, write_version, ...
    themis_items(id bigserial, key UNIQUE, path, size, mtime_ns, sha256, metadata text,
                 doc jsonb, thumbnail bytea, written bigint, embedding vector(dim))
    themis_failures(path PRIMARY KEY, size, mtime_ns, error)
    themis_removed(id PRIMARY KEY, at)
    themis_ocr(id PRIMARY KEY → themis_items, text, lines jsonb, grams text[])   (v3)

``metadata`` keeps the JSON text as given back; ``doc`` is the same JSON as ``jsonb`` for
filters and facets (jsonb cannot hold U+0000, which ``doc`` holds as U+FFFD, in filters too:
:func:`~themis_clip.index.wheresql.jsonb_text`).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from themis_clip.errors import SearchIndexError
from themis_clip.index.wheresql import pg_instant, pg_number

__all__ = [
    "INTEGRITY_SQL",
    "MIGRATIONS",
    "MIGRATION_LOCK",
    "PG_SCHEMA_VERSION",
    "TABLES",
    "ensure_extension",
    "first_line",
    "has_halfvec",
    "redact",
    "schema_version",
]

PG_SCHEMA_VERSION = 3
#: True when the tables agree with each other (:meth:`.store.PgStore.integrity_ok`). Ids come from a
#: sequence and are never reused, so a removed id that is still an item is a torn write.
INTEGRITY_SQL = """SELECT
    (SELECT count(*) FROM themis_meta WHERE key = 'write_version' AND value ~ '^[0-9]+$') = 1
    AND NOT EXISTS (SELECT 1 FROM themis_items WHERE written > (SELECT value::bigint
        FROM themis_meta WHERE key = 'write_version' AND value ~ '^[0-9]+$'))
    AND NOT EXISTS (SELECT 1 FROM themis_items i JOIN themis_removed r ON r.id = i.id)
    AND NOT EXISTS (SELECT 1 FROM themis_items WHERE (doc IS NULL) <> (metadata IS NULL))
    AND NOT EXISTS (SELECT 1 FROM themis_items WHERE vector_dims(embedding) <> COALESCE(
        (SELECT value::int FROM themis_meta WHERE key = 'dim' AND value ~ '^[0-9]+$'),
        vector_dims(embedding)))"""
#: The index's tables (dropped by ``--rebuild``, counted by ``size_bytes``).
TABLES = ("themis_items", "themis_meta", "themis_failures", "themis_removed", "themis_ocr")
MIGRATION_LOCK = 0x7468656D6973  # pg_advisory_xact_lock key for migrations ("themis")

#: v2: lexical search (:mod:`themis_clip.index.lexical`): a generated ``tsvector`` of key, path
#: (``/``, ``.`` and ``-`` as spaces, so ``IMG_4711.jpg`` holds ``img`` and ``4711`` side by
#: side) and every string in ``doc``, under a GIN index. Adding the generated column fills it
#: for the rows already stored.
_FTS_DDL = [
    """ALTER TABLE themis_items ADD COLUMN IF NOT EXISTS lexical tsvector GENERATED ALWAYS AS (
        to_tsvector('simple'::regconfig, translate(key || ' ' || coalesce(path, ''), '/.-', '   '))
        || jsonb_to_tsvector('simple'::regconfig, coalesce(doc, 'null'::jsonb), '["string"]'::jsonb)
    ) STORED""",
    "CREATE INDEX IF NOT EXISTS themis_items_lexical ON themis_items USING gin (lexical)",
]
# v2 (photo): ``where`` filters on dates and places by expression index. ``themis_instant``
# reads an ISO 8601 date or date-time as epoch seconds (no offset: UTC; not a date: NULL). It
# is immutable in fact (an explicit offset or UTC, never the session's time zone), so it may
# be indexed; the index expressions are the very ones :func:`..wheresql.compile_postgres` writes.
_TAKEN = "(doc -> 'taken')"
_WHERE_INDEXES = [
    r"""CREATE OR REPLACE FUNCTION themis_instant(t text) RETURNS numeric
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $f$
    BEGIN
      IF t IS NULL OR t !~ ('^\d{4}-\d{2}-\d{2}'
                            || '([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?)?$') THEN
        RETURN NULL;
      END IF;
      IF t ~ '[T ]' AND t ~ '(Z|[+-]\d{2}:\d{2})$' THEN
        RETURN extract(epoch FROM t::timestamptz);
      END IF;
      RETURN extract(epoch FROM (t::timestamp AT TIME ZONE 'UTC'));
    EXCEPTION WHEN others THEN
      RETURN NULL;
    END
    $f$""",
    "CREATE INDEX IF NOT EXISTS themis_items_taken ON themis_items (("
    + pg_instant(_TAKEN, _TAKEN)
    + "))",
    "CREATE INDEX IF NOT EXISTS themis_items_gps ON themis_items (("
    + pg_number("(doc -> 'gps' -> 'lat')", "(doc -> 'gps' -> 'lat')")
    + "), ("
    + pg_number("(doc -> 'gps' -> 'lon')", "(doc -> 'gps' -> 'lon')")
    + "))",
    "CREATE INDEX IF NOT EXISTS themis_items_camera ON themis_items ((doc -> 'camera' -> 'make'))",
]

#: v3: the text read in pictures (OCR), one row per item read (``text`` empty: none found),
#: gone with its item. ``grams`` holds its words' trigrams (:func:`..lexical.trigrams`) under
#: a GIN index: substring and tolerant matching with no extension (``pg_trgm`` is contrib,
#: absent from many servers). An index never read has no rows.
_OCR_DDL = [
    """CREATE TABLE IF NOT EXISTS themis_ocr (
        id bigint PRIMARY KEY REFERENCES themis_items (id) ON DELETE CASCADE,
        text text NOT NULL,
        lines jsonb NOT NULL,
        grams text[] NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS themis_ocr_grams ON themis_ocr USING gin (grams)",
]

MIGRATIONS: dict[int, list[str]] = {
    1: [
        "CREATE TABLE IF NOT EXISTS themis_meta (key text PRIMARY KEY, value text NOT NULL)",
        """CREATE TABLE themis_items (
            id bigserial PRIMARY KEY,
            key text NOT NULL UNIQUE,
            path text,
            size bigint,
            mtime_ns bigint,
            sha256 text,
            metadata text,
            doc jsonb,
            thumbnail bytea,
            written bigint NOT NULL DEFAULT 0,
            embedding vector NOT NULL
        )""",
        "CREATE INDEX themis_items_sha256 ON themis_items (sha256)",
        "CREATE INDEX themis_items_path ON themis_items (path text_pattern_ops)",
        "CREATE INDEX themis_items_written ON themis_items (written)",
        "CREATE INDEX themis_items_doc ON themis_items USING gin (doc)",
        """CREATE TABLE themis_failures (
            path text PRIMARY KEY, size bigint, mtime_ns bigint, error text NOT NULL
        )""",
        "CREATE TABLE themis_removed (id bigint PRIMARY KEY, at bigint NOT NULL)",
        "CREATE INDEX themis_removed_at ON themis_removed (at)",
    ],
    # v2: lexical search (tsvector) and expression indexes for where-filters on dates and places.
    2: [*_FTS_DDL, *_WHERE_INDEXES],
    # v3: the text read in pictures (OCR) and its trigrams.
    3: _OCR_DDL,
}


def redact(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def ensure_extension(conn: Any, *, where: str, readonly: bool) -> str:
    """The pgvector version in ``conn``'s database, enabling the extension when it is
    installed but not enabled (and this role may); else the error that says what to do."""
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    if row is not None:
        return str(row[0])
    available = conn.execute(
        "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
    ).fetchone()
    database = conn.info.dbname
    if available is None:
        raise SearchIndexError(
            f"PostgreSQL at {where} has no pgvector extension installed "
            "(https://github.com/pgvector/pgvector); install it on the server, then "
            f"`CREATE EXTENSION vector;` in database {database!r}"
        )
    if readonly:
        raise SearchIndexError(
            f"database {database!r} at {where} has no pgvector extension enabled "
            "(and this open is read-only); open it writable once, or "
            "`CREATE EXTENSION vector;` as a superuser"
        )
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except Exception as exc:  # the driver's error, told in the message
        raise SearchIndexError(
            f"database {database!r} at {where} has no pgvector extension enabled, and "
            f"this role cannot enable it ({first_line(exc)}); run "
            "`CREATE EXTENSION vector;` in it as a superuser"
        ) from exc
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    return str(row[0])


def schema_version(conn: Any) -> int:
    """The index's schema version in ``conn``'s current schema (0: none yet). Only that
    schema counts: one searched after it (the live index, for a migration's shadow schema
    searched ahead of it) is another index."""
    exists = conn.execute(
        "SELECT to_regclass(quote_ident(current_schema()) || '.themis_meta')"
    ).fetchone()[0]
    if exists is None:
        return 0
    row = conn.execute("SELECT value FROM themis_meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def has_halfvec(extension_version: str) -> bool:
    """Whether this pgvector version has ``halfvec`` (0.7 and later)."""
    parts = [int(p) for p in re.findall(r"\d+", extension_version)[:2]] + [0, 0]
    return (parts[0], parts[1]) >= (0, 7)
