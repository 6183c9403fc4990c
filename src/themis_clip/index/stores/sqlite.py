"""The only module that imports ``sqlite3``: items, their vectors and the index's model identity.

Schema (``PRAGMA user_version`` is the schema version; migrations run in order, each in one
transaction; an index written by a newer themis-clip is refused, not guessed at)::

    meta(key TEXT PRIMARY KEY, value TEXT)          model_id, model_name, model_sha256, dim,
                                                    write_version (bumped by every write)
    items(id INTEGER PRIMARY KEY, key TEXT UNIQUE,  key: the caller's id (the path for folders)
          path TEXT, size INTEGER, mtime_ns INTEGER, sha256 TEXT,
          metadata TEXT, vector BLOB)               vector: float32, little endian
    failures(path TEXT PRIMARY KEY, size, mtime_ns, error)   unreadable files, skipped until changed
    items.thumbnail BLOB (v2)                       JPEG preview of items added without a file
    (v3) metadata repaired: NaN/Infinity → null, lone surrogates → U+FFFD, unreadable → NULL
    items.written INTEGER (v4)                      the write_version that last wrote the vector
    removed(id PRIMARY KEY, at INTEGER) (v4)        ids deleted, and at which write_version
    fields(id, key, kind, value) (v5)               each item's top-level metadata values, as
                                                    :func:`.metadata.comparable` makes them

``written`` and ``removed`` let a search graph or matrix catch up with the writes since the
version it reflects (:meth:`IndexStore.changes_since`) instead of being rebuilt.

Metadata is validated on the way in (:mod:`.metadata`: bounded, strict JSON objects) and read
back without ever raising. Filters, facets and key checks read ``fields``, whose index on
``(key, kind, value)`` answers each filter term with one index range, whatever the number
of keys the items hold (scanning every item's JSON took seconds with ~500 keys an item).

The database runs in WAL mode with ``synchronous=NORMAL``: a killed process loses at most the
transaction it was in, never a committed one, and never leaves a half-written row.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.errors import SearchIndexError
from themis_clip.index.metadata import comparable, decode_stored, repair, validate_filters
from themis_clip.index.stores.base import StoreKind
from themis_clip.index.stores.rows import (
    COLUMNS,
    ItemRow,
    StoredItem,
    checked,
    like_under,
    stored_item,
)

log = logging.getLogger(__name__)

__all__ = ["SCHEMA_VERSION", "IndexStore", "ItemRow", "StoredItem"]

SCHEMA_VERSION = 5
# One filter term, constant SQL: key, kind and value are bound parameters.
_FILTER_TERM = "SELECT id FROM fields WHERE key = ? AND kind = ? AND value IS ?"
_ADD_FIELDS = "INSERT OR REPLACE INTO fields(id, key, kind, value) SELECT id, ?, ?, ? FROM items"


def _fields(metadata: Mapping[str, Any] | None) -> list[tuple[str, str, Any]]:
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
            for field in _fields(decode_stored(text, key=key))
        ],
    )


_MIGRATIONS: dict[int, list[str | Callable[[sqlite3.Connection], None]]] = {
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
}


class IndexStore:
    """An SQLite file holding items and vectors.

    Args:
        path: the database file (created unless ``readonly``).
        readonly: open without write access (``mode=ro``); a missing file is an error.
    """

    kind = StoreKind.SQLITE

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._meta_cache: dict[str, str] | None = None
        self._meta_seen = -1
        if readonly and not self.path.is_file():
            raise SearchIndexError(
                f"no index at {self.path}; build one with `themis-clip index DIR`"
            )
        uri = f"file:{self.path}?mode=ro" if readonly else f"file:{self.path}"
        try:
            if not readonly:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA busy_timeout = 10000")
            if not readonly:
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise SearchIndexError(f"cannot open index {self.path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> IndexStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema --------------------------------------------------------------------------------

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise SearchIndexError(
                f"index {self.path} has schema version {version}, newer than this themis-clip "
                f"supports ({SCHEMA_VERSION}); upgrade themis-onnx-clip"
            )
        if version == SCHEMA_VERSION:
            return
        if self.readonly:
            raise SearchIndexError(f"index {self.path} needs a migration; open it writable once")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self.transaction() as db:
                for step in _MIGRATIONS[target]:
                    if callable(step):
                        step(db)
                    else:
                        db.execute(step)
                db.execute(f"PRAGMA user_version = {target}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: committed whole, or rolled back whole."""
        if self.readonly:
            raise SearchIndexError(f"index {self.path} is open read-only")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            self._meta_cache = None
            raise
        self._db.execute(
            "INSERT INTO meta(key, value) VALUES('write_version', '1') ON CONFLICT(key) "
            "DO UPDATE SET value = CAST(value AS INTEGER) + 1"
        )
        self._db.execute("COMMIT")
        self._meta_cache = None  # this connection's own commits do not change data_version

    # -- meta ----------------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        """The meta table, cached until a write here or elsewhere (SQLite's ``data_version``
        changes when another connection commits): searches read it at no cost."""
        (seen,) = self._db.execute("PRAGMA data_version").fetchone()
        if self._meta_cache is None or seen != self._meta_seen:
            self._meta_cache = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            self._meta_seen = seen
        return dict(self._meta_cache)

    def set_meta(self, values: Mapping[str, str | int]) -> None:
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO meta(key, value) VALUES(?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [(k, str(v)) for k, v in values.items()],
            )

    def tag_graph(self, version: int) -> int:
        """Record that the saved graph reflects store ``version``; returns the tag written
        (the new version itself when nothing was written since ``version``)."""
        with self.transaction() as db:
            current = self.write_version
            tag = current + 1 if current == version else version
            db.execute(
                "INSERT INTO meta(key, value) VALUES('ann_version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (str(tag),),
            )
        return tag

    @property
    def write_version(self) -> int:
        return int(self.meta().get("write_version", 0))

    # -- items ---------------------------------------------------------------------------------

    def upsert(self, rows: Sequence[ItemRow], *, dim: int) -> None:
        """Insert or replace ``rows`` (matched by key) in one transaction."""
        if not rows:
            return
        values = []
        for r in rows:
            vec, meta = checked(r, dim)
            values.append(
                (r.key, r.path, r.size, r.mtime_ns, r.sha256, meta, vec.tobytes(), r.thumbnail)
            )
        with self.transaction() as db:
            written = self.write_version + 1  # the version this transaction commits as
            db.executemany(
                """INSERT INTO items(key, path, size, mtime_ns, sha256, metadata, vector, thumbnail,
                                     written)
                   VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT(key) DO UPDATE SET path = excluded.path, size = excluded.size,
                     mtime_ns = excluded.mtime_ns, sha256 = excluded.sha256,
                     metadata = excluded.metadata, vector = excluded.vector,
                     thumbnail = excluded.thumbnail, written = excluded.written""",
                [(*v, written) for v in values],
            )
            db.executemany(
                "DELETE FROM fields WHERE id = (SELECT id FROM items WHERE key = ?)",
                [(r.key,) for r in rows],
            )
            db.executemany(
                _ADD_FIELDS + " WHERE key = ?",
                [(*field, r.key) for r in rows for field in _fields(r.metadata)],
            )
            db.executemany(
                "DELETE FROM failures WHERE path = ?", [(r.path,) for r in rows if r.path]
            )

    def delete_keys(self, keys: Iterable[str]) -> int:
        keys = list(keys)
        if not keys:
            return 0
        with self.transaction() as db:
            at = self.write_version + 1
            gone = []
            for key in keys:
                gone += db.execute(
                    "DELETE FROM items WHERE key = ? RETURNING id", (key,)
                ).fetchall()
            db.executemany(
                "INSERT OR REPLACE INTO removed(id, at) VALUES(?, ?)", [(i, at) for (i,) in gone]
            )
            db.executemany("DELETE FROM fields WHERE id = ?", gone)
            return len(gone)

    def rename(self, old_key: str, new_key: str, *, path: str, size: int, mtime_ns: int) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE items SET key = ?, path = ?, size = ?, mtime_ns = ? WHERE key = ?",
                (new_key, path, size, mtime_ns, old_key),
            )

    def _select(self, where: str, params: Sequence[Any]) -> sqlite3.Cursor:
        # Constant SQL built here; every value is a bound parameter.
        return self._db.execute(f"SELECT {COLUMNS} FROM items WHERE {where}", params)  # noqa: S608

    def get(self, key: str) -> StoredItem | None:
        row = self._select("key = ?", (key,)).fetchone()
        return stored_item(row) if row else None

    def items_under(self, prefix: str) -> dict[str, StoredItem]:
        """Items whose path lies under the folder ``prefix`` (keyed by path)."""
        rows = self._select("path LIKE ? ESCAPE '\\'", (like_under(prefix),)).fetchall()
        return {r[2]: stored_item(r) for r in rows}

    def by_sha256(self, digest: str) -> list[StoredItem]:
        rows = self._select("sha256 = ?", (digest,)).fetchall()
        return [stored_item(r) for r in rows]

    def vector(self, key: str) -> npt.NDArray[np.float32] | None:
        row = self._db.execute("SELECT vector FROM items WHERE key = ?", (key,)).fetchone()
        return np.frombuffer(row[0], dtype="<f4").astype(np.float32) if row else None

    def thumbnail(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT thumbnail FROM items WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row and row[0] is not None else None

    def count(self) -> int:
        (n,) = self._db.execute("SELECT COUNT(*) FROM items").fetchone()
        return int(n)

    def load_vectors(self, dim: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """All ``(ids, vectors [n, dim])``, in id order."""
        rows = self._db.execute("SELECT id, vector FROM items ORDER BY id").fetchall()
        return _unpack(rows, dim)

    def changes_since(
        self, version: int, dim: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """What changed after ``version``: ``(written ids, their vectors, removed ids)``.

        A removed id may come back written (SQLite reuses the largest id): remove first.
        """
        rows = self._db.execute(
            "SELECT id, vector FROM items WHERE written > ? ORDER BY id", (version,)
        ).fetchall()
        ids, matrix = _unpack(rows, dim)
        gone = self._db.execute("SELECT id FROM removed WHERE at > ?", (version,)).fetchall()
        return ids, matrix, np.fromiter((r[0] for r in gone), dtype=np.int64, count=len(gone))

    def vectors_by_id(self, ids: Sequence[int], dim: int) -> npt.NDArray[np.float32]:
        """The float32 vectors of ``ids``, in that order (a missing id gives a zero row)."""
        out = np.zeros((len(ids), dim), dtype=np.float32)
        if not len(ids):
            return out
        where = {int(i): n for n, i in enumerate(ids)}
        marks = ",".join("?" * len(where))
        sql = f"SELECT id, vector FROM items WHERE id IN ({marks})"  # noqa: S608 - only "?" marks
        for row_id, blob in self._db.execute(sql, list(where)).fetchall():
            out[where[row_id]] = np.frombuffer(blob, dtype="<f4")
        return out

    def size_bytes(self) -> int:
        """The database's size on disk (write-ahead log included)."""
        files = [self.path, Path(str(self.path) + "-wal")]
        return sum(f.stat().st_size for f in files if f.is_file())

    def items_by_id(self, ids: Sequence[int]) -> dict[int, StoredItem]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self._select(f"id IN ({marks})", [int(i) for i in ids]).fetchall()
        return {r[0]: stored_item(r) for r in rows}

    def ids_matching(self, filters: Mapping[str, Any]) -> set[int]:
        """Ids whose metadata has each top-level ``key`` equal to ``value`` (JSON equality:
        :func:`comparable`), one index range per key; a row whose metadata could not be read
        back has no fields and matches nothing."""
        terms = [(key, *comparable(value)) for key, value in validate_filters(filters).items()]
        if not terms:
            return {r[0] for r in self._db.execute("SELECT id FROM items").fetchall()}
        sql = " INTERSECT ".join([_FILTER_TERM] * len(terms))
        return {r[0] for r in self._db.execute(sql, [p for t in terms for p in t]).fetchall()}

    def metadata_keys_present(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` some item's metadata has at its top level."""
        wanted = list(dict.fromkeys(keys))
        found = set()
        for key in wanted:  # one index probe each
            row = self._db.execute("SELECT 1 FROM fields WHERE key = ? LIMIT 1", (key,))
            if row.fetchone():
                found.add(key)
        return found

    def metadata_facets(self, *, max_keys: int = 50, max_values: int = 20) -> list[dict[str, Any]]:
        """The top-level metadata keys the index holds, most common first, with how many items
        have each and their most common scalar values (for filter pickers; ``max_values`` 0:
        the keys only)."""
        keys = self._db.execute(
            "SELECT key, COUNT(*) AS n FROM fields GROUP BY key ORDER BY n DESC, key LIMIT ?",
            (max_keys,),
        ).fetchall()
        out = []
        for key, count in keys:
            rows = []
            if max_values > 0:
                rows = self._db.execute(
                    "SELECT value, kind, COUNT(*) AS n FROM fields WHERE key = ? "
                    "AND kind NOT IN ('object', 'array') "
                    "GROUP BY kind, value ORDER BY n DESC, value LIMIT ?",
                    (key, max_values + 1),
                ).fetchall()
            values = [{"value": _json_scalar(value, kind), "count": n} for value, kind, n in rows]
            out.append(
                {
                    "key": key,
                    "count": count,
                    "values": values[:max_values],
                    "more_values": len(values) > max_values,
                }
            )
        return out

    # -- failures ------------------------------------------------------------------------------

    def record_failures(self, rows: Sequence[tuple[str, int, int, str]]) -> None:
        if rows:
            with self.transaction() as db:
                db.executemany(
                    "INSERT OR REPLACE INTO failures(path, size, mtime_ns, error) "
                    "VALUES(?, ?, ?, ?)",
                    rows,
                )

    def failures_under(self, prefix: str) -> dict[str, tuple[int, int, str]]:
        rows = self._db.execute(
            "SELECT path, size, mtime_ns, error FROM failures WHERE path LIKE ? ESCAPE '\\'",
            (like_under(prefix),),
        ).fetchall()
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    def delete_failures(self, paths: Iterable[str]) -> None:
        paths = list(paths)
        if paths:
            with self.transaction() as db:
                db.executemany("DELETE FROM failures WHERE path = ?", [(p,) for p in paths])

    def integrity_ok(self) -> bool:
        (result,) = self._db.execute("PRAGMA integrity_check").fetchone()
        return bool(result == "ok")


def _unpack(
    rows: Sequence[tuple[int, bytes]], dim: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    matrix = np.empty((len(rows), dim), dtype=np.float32)
    for i, (_, blob) in enumerate(rows):
        matrix[i] = np.frombuffer(blob, dtype="<f4")
    return ids, matrix


def _json_scalar(value: Any, kind: str) -> Any:
    """A field's SQL value as the JSON scalar it came from (booleans are 1/0 there)."""
    return bool(value) if kind == "bool" else value
