"""The SQLite store's schema: its versions and migrations, and the ``fields`` table that
equality filters read (:mod:`.store` runs them; the schema is drawn in its docstring)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from themis_clip.index.metadata import comparable, decode_stored, repair
from themis_clip.index.wheresql import sqlite_instant, sqlite_number, sqlite_text

__all__ = ["ADD_FIELDS", "MIGRATIONS", "SCHEMA_VERSION", "STALE_OCR", "fields_of"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 7
ADD_FIELDS = "INSERT OR REPLACE INTO fields(id, key, kind, value) SELECT id, ?, ?, ? FROM items"


def fields_of(metadata: Mapping[str, Any] | None) -> list[tuple[str, str, Any]]:
    """``(key, kind, value)`` of each top-level metadata value (:func:`comparable`)."""
    return [(key, *comparable(value)) for key, value in (metadata or {}).items()]


def _repair_metadata(db: sqlite3.Connection) -> None:
    """v3: rows that an older version let in with metadata no reader can parse or serve."""
    rows = db.execute(
        "SELECT id, metadata FROM items WHERE metadata IS NOT NULL AND "
        "(NOT json_valid(metadata) OR metadata GLOB '*[\\]u[dD][89abAB]*' "
        "OR metadata GLOB '*[\\]u[dD][c-fC-F]*')"
    ).fetchall()
    fixed = [(repair(text), row_id) for row_id, text in rows]
    db.executemany("UPDATE items SET metadata = ? WHERE id = ?", fixed)
    if fixed:
        log.warning("index: repaired the metadata of %d item(s) (older version)", len(fixed))


def _track_changes(db: sqlite3.Connection) -> None:
    """v4: change tracking, so search structures catch up with writes instead of being rebuilt.
    A graph saved before it cannot tell what changed since, so its tag is dropped (rebuilt
    once). Idempotent: an index whose version number was lowered by hand still opens."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(items)")}
    if "written" not in columns:
        db.execute("ALTER TABLE items ADD COLUMN written INTEGER NOT NULL DEFAULT 0")
    db.execute("CREATE INDEX IF NOT EXISTS items_written ON items(written)")
    db.execute("CREATE TABLE IF NOT EXISTS removed (id INTEGER PRIMARY KEY, at INTEGER NOT NULL)")
    db.execute("CREATE INDEX IF NOT EXISTS removed_at ON removed(at)")
    db.execute("DELETE FROM meta WHERE key = 'ann_version'")


def _index_fields(db: sqlite3.Connection) -> None:
    """v5: the fields table, filled from the metadata already stored."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS fields (id INTEGER NOT NULL, key TEXT NOT NULL, "
        "kind TEXT NOT NULL, value, PRIMARY KEY (id, key)) WITHOUT ROWID"
    )
    db.execute("CREATE INDEX IF NOT EXISTS fields_value ON fields(key, kind, value)")
    rows = db.execute("SELECT id, key, metadata FROM items WHERE metadata IS NOT NULL")
    db.executemany(
        "INSERT OR REPLACE INTO fields(id, key, kind, value) VALUES(?, ?, ?, ?)",
        [
            (row_id, *field)
            for row_id, key, text in rows.fetchall()
            for field in fields_of(decode_stored(text, key=key))
        ],
    )


# The words lexical search finds an item by: its key, path and metadata's string values
# (nested ones too; metadata an older version let in unreadable counts as none).
_LEXICAL_ROW = (
    "SELECT {p}id, {p}key, coalesce({p}path, ''), coalesce((SELECT group_concat(value, ' ') "
    "FROM json_tree(CASE WHEN json_valid({p}metadata) THEN {p}metadata ELSE 'null' END) "
    "WHERE type = 'text'), '')"
)
#: v6: lexical search (:mod:`themis_clip.index.lexical`): an FTS5 table kept by triggers, so
#: every writer (upsert, rename, delete) keeps it current; filled from the rows already stored.
_FTS_DDL: list[str | Callable[[sqlite3.Connection], None]] = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS lexical USING fts5(key, path, meta, "
    "tokenize = \"unicode61 tokenchars '_'\")",
    "CREATE TRIGGER IF NOT EXISTS items_lexical_insert AFTER INSERT ON items BEGIN "
    "INSERT INTO lexical(rowid, key, path, meta) " + _LEXICAL_ROW.format(p="new.") + "; END",
    "CREATE TRIGGER IF NOT EXISTS items_lexical_update AFTER UPDATE OF key, path, metadata "  # noqa: S608
    "ON items BEGIN DELETE FROM lexical WHERE rowid = old.id; "
    "INSERT INTO lexical(rowid, key, path, meta) " + _LEXICAL_ROW.format(p="new.") + "; END",
    "CREATE TRIGGER IF NOT EXISTS items_lexical_delete AFTER DELETE ON items BEGIN "
    "DELETE FROM lexical WHERE rowid = old.id; END",
    "DELETE FROM lexical",
    "INSERT INTO lexical(rowid, key, path, meta) " + _LEXICAL_ROW.format(p="") + " FROM items",
]
# v6 (photo): expression indexes for the ``where`` language's indexed paths (the very
# expressions :func:`..wheresql.compile_sqlite` writes for them), so a date range or a geo box
# over 100k items reads an index range instead of every row's JSON (and so does a camera make).
_TAKEN = "'$.taken'"
_WHERE_INDEXES: list[str | Callable[[sqlite3.Connection], None]] = [
    "CREATE INDEX IF NOT EXISTS items_taken ON items("
    + sqlite_instant(_TAKEN, _TAKEN, _TAKEN)
    + ")",
    "CREATE INDEX IF NOT EXISTS items_gps ON items("
    + sqlite_number("'$.gps.lat'", "'$.gps.lat'")
    + ", "
    + sqlite_number("'$.gps.lon'", "'$.gps.lon'")
    + ")",
    "CREATE INDEX IF NOT EXISTS items_camera ON items("
    + sqlite_text("'$.camera.make'", "'$.camera.make'")
    + ")",
]

#: v7: the text read in pictures (OCR), one row per item that was read (``text`` empty: none
#: found), substring-searchable through an FTS5 trigram index kept by triggers. A deleted item
#: loses its row (a trigger); one rewritten with other content, its reading (:data:`STALE_OCR`).
#: An index never read has no rows.
_OCR_DDL: list[str | Callable[[sqlite3.Connection], None]] = [
    "CREATE TABLE IF NOT EXISTS ocr (id INTEGER PRIMARY KEY, text TEXT NOT NULL, "
    "lines TEXT NOT NULL)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS ocr_lexical USING fts5(text, content = 'ocr', "
    "content_rowid = 'id', tokenize = 'trigram')",
    "CREATE TRIGGER IF NOT EXISTS ocr_lexical_insert AFTER INSERT ON ocr BEGIN "
    "INSERT INTO ocr_lexical(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER IF NOT EXISTS ocr_lexical_delete AFTER DELETE ON ocr BEGIN "
    "INSERT INTO ocr_lexical(ocr_lexical, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER IF NOT EXISTS ocr_lexical_update AFTER UPDATE ON ocr BEGIN "
    "INSERT INTO ocr_lexical(ocr_lexical, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO ocr_lexical(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER IF NOT EXISTS items_ocr_delete AFTER DELETE ON items BEGIN "
    "DELETE FROM ocr WHERE id = old.id; END",
]
#: The readings an upsert of other content makes stale (bound: key, new sha256 twice); run by
#: the store only when some item has a reading, so an index without OCR does no work per row.
STALE_OCR = (
    "DELETE FROM ocr WHERE id = (SELECT id FROM items WHERE key = ? "
    "AND (? IS NULL OR sha256 IS NOT ?))"
)

MIGRATIONS: dict[int, list[str | Callable[[sqlite3.Connection], None]]] = {
    1: [
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE items (
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL UNIQUE,
            path TEXT,
            size INTEGER,
            mtime_ns INTEGER,
            sha256 TEXT,
            metadata TEXT,
            vector BLOB NOT NULL
        )""",
        "CREATE INDEX items_sha256 ON items(sha256)",
        "CREATE INDEX items_path ON items(path)",
        """CREATE TABLE failures (
            path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, error TEXT NOT NULL
        )""",
    ],
    # v2: small JPEG previews for items that have no file on disk (added over HTTP).
    2: ["ALTER TABLE items ADD COLUMN thumbnail BLOB"],
    # v3: metadata that is not strict JSON (NaN) or holds lone surrogates, rewritten once.
    3: [_repair_metadata],
    # v4: change tracking, so search structures catch up instead of rebuilding. A graph saved
    # before it cannot tell what changed since, so it is dropped (rebuilt once).
    4: [_track_changes],
    # v5: filters and facets by index (a table of top-level values), not by scanning JSON.
    5: [_index_fields],
    # v6: lexical search over key, path and string metadata (FTS5), and expression indexes for
    # where-filters on dates and places.
    6: [*_FTS_DDL, *_WHERE_INDEXES],
    # v7: the text read in pictures (OCR) and its trigram index.
    7: _OCR_DDL,
}
