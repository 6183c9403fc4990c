"""An index in an SQLite file: items, their vectors and the index's model identity.

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
    items_taken, items_gps (v6)                     expression indexes for ``where`` filters
                                                    on ``taken`` and ``gps``
    ocr(id PRIMARY KEY, text, lines) (v7)           the text read in an item (OCR), its lines
                                                    as JSON; ``ocr_lexical`` its trigram index

``written`` and ``removed`` let a search graph or matrix catch up with the writes since the
version it reflects (:meth:`SQLiteStore.changes_since`) instead of being rebuilt.

Metadata is validated on the way in (:mod:`themis_clip.index.metadata`: bounded, strict JSON
objects) and read back without ever raising. Equality filters, facets and key checks read
``fields``, whose index on ``(key, kind, value)`` answers each term with one index range,
whatever the number of keys the items hold (scanning every item's JSON took seconds with ~500
keys an item). The reads beyond items and vectors are :mod:`.queries`.

The database runs in WAL mode with ``synchronous=NORMAL``: a killed process loses at most the
transaction it was in, never a committed one, and never leaves a half-written row. Writes go
through one connection; reads through one connection per thread (WAL readers do not wait for
each other or for the writer, and never see a transaction another thread has not committed),
except inside this thread's own transaction, which reads what it is writing.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.errors import SearchIndexError
from themis_clip.index.metadata import encode, validate_metadata
from themis_clip.index.stores.base import StoreKind
from themis_clip.index.stores.rows import (
    COLUMNS,
    ItemRow,
    StoredItem,
    checked,
    like_under,
    ocr_row,
    stored_item,
)
from themis_clip.index.stores.sqlite import queries
from themis_clip.index.stores.sqlite.schema import (
    ADD_FIELDS,
    MIGRATIONS,
    SCHEMA_VERSION,
    STALE_OCR,
    fields_of,
)
from themis_clip.index.where import Where

log = logging.getLogger(__name__)

__all__ = ["SCHEMA_VERSION", "ItemRow", "SQLiteStore", "StoredItem"]


def _writable(path: Path) -> bool:
    """Whether the index file and its folder (its -wal and -shm files) can be written."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def _readable_now(db: sqlite3.Connection) -> bool:
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        if "unable to open" in str(exc) or "readonly" in str(exc):
            return False
        raise
    return True


def _enter_wal(db: sqlite3.Connection, patience_s: float = 10.0) -> None:
    """Switch a writable index to WAL. The switch takes an exclusive lock without calling the
    busy handler, so openers of one new file at once can see "database is locked": retry it
    for as long as ``busy_timeout`` would have waited."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


class SQLiteStore:
    """An SQLite file holding items and vectors.

    Args:
        path: the database file (created unless ``readonly``).
        readonly: open without write access (``mode=ro``); a missing file is an error.
    """

    kind = StoreKind.SQLITE

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._local = threading.local()  # this thread's reader and its meta cache
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._writing_thread: int | None = None
        if readonly and not self.path.is_file():
            raise SearchIndexError(
                f"no index at {self.path}; build one with "
                f"`themis-clip index DIR --index {shlex.quote(str(self.path))}`"
            )
        self._ro_uri = f"file:{self.path}?mode=ro"
        if not readonly and self.path.exists() and not _writable(self.path):
            raise SearchIndexError(
                f"index {self.path} is read-only (no write access to the file or its folder): "
                "search it as it is, or copy it somewhere writable to add to it"
            )
        uri = self._ro_uri if readonly else f"file:{self.path}"
        try:
            if not readonly:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA busy_timeout = 10000")
            if readonly and not _readable_now(self._db):
                # Read-only media: a WAL index without its -shm file cannot be opened in
                # ``mode=ro`` (SQLite would create the -shm); nothing can change it there.
                self._db.close()
                self._ro_uri += "&immutable=1"
                self._db = sqlite3.connect(
                    self._ro_uri, uri=True, check_same_thread=False, isolation_level=None
                )
            if not readonly:
                _enter_wal(self._db)
                self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise SearchIndexError(f"cannot open index {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._readers_lock:
            for reader in self._readers:
                reader.close()
            self._readers.clear()
        self._db.close()

    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection (the writer's own inside its transaction)."""
        if self._writing_thread == threading.get_ident():
            return self._db
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self._ro_uri,
                    uri=True,
                    check_same_thread=False,
                    isolation_level=None,
                )
                conn.execute("PRAGMA busy_timeout = 10000")
            except sqlite3.DatabaseError as exc:
                raise SearchIndexError(f"cannot open index {self.path}: {exc}") from exc
            with self._readers_lock:
                self._readers.append(conn)
            self._local.conn, self._local.meta = conn, (-1, {})
        return conn

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema --------------------------------------------------------------------------------

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SearchIndexError(
                f"index {self.path} has schema version {version}, newer than this themis-clip "
                f"supports ({SCHEMA_VERSION}); upgrade themis-onnx-clip"
            )

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        self._check_version(version)
        if version == SCHEMA_VERSION:
            return
        if self.readonly:
            # Read-only means "this caller writes no items"; a schema step is the store's own
            # business, so a file this process may write is migrated (a writable open does it).
            if not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK)):
                raise SearchIndexError(
                    f"index {self.path} needs a migration; open it writable once"
                )
            log.info(
                "index %s: schema %d -> %d before a read-only open",
                self.path,
                version,
                SCHEMA_VERSION,
            )
            SQLiteStore(self.path).close()
            return
        # One write transaction, the version read again inside it: another process that
        # opened the same new file at once has either migrated it already or waits for this.
        with self.transaction() as db:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            self._check_version(version)
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for step in MIGRATIONS[target]:
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
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise SearchIndexError(f"cannot write index {self.path}: {exc}") from exc
        self._writing_thread = threading.get_ident()
        try:
            yield self._db
            self._db.execute(
                "INSERT INTO meta(key, value) VALUES('write_version', '1') ON CONFLICT(key) "
                "DO UPDATE SET value = CAST(value AS INTEGER) + 1"
            )
            self._db.execute("COMMIT")
        except BaseException as exc:
            self._writing_thread = None
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):
                # A full disk, an I/O error, a lock held too long: the store's own error.
                raise SearchIndexError(f"cannot write index {self.path}: {exc}") from exc
            raise
        self._writing_thread = None

    # -- meta ----------------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        """The meta table, cached per reader until a write here or elsewhere (a connection's
        ``data_version`` changes when another one commits): searches read it at no cost."""
        db = self._reader()
        if db is self._db:  # inside this thread's transaction: what it has written so far
            return dict(db.execute("SELECT key, value FROM meta").fetchall())
        (seen,) = db.execute("PRAGMA data_version").fetchone()
        cached_at, cached = self._local.meta
        if seen != cached_at:
            cached = dict(db.execute("SELECT key, value FROM meta").fetchall())
            self._local.meta = (seen, cached)
        return dict(cached)

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

    def expect_model(self, sha256: str) -> None:
        """Nothing to check: a cut-over waits until no other process has the file open."""

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
            if db.execute("SELECT 1 FROM ocr LIMIT 1").fetchone() is not None:
                db.executemany(STALE_OCR, [(r.key, r.sha256, r.sha256) for r in rows])
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
                ADD_FIELDS + " WHERE key = ?",
                [(*field, r.key) for r in rows for field in fields_of(r.metadata)],
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
        return self._reader().execute(f"SELECT {COLUMNS} FROM items WHERE {where}", params)  # noqa: S608

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
        row = self._reader().execute("SELECT vector FROM items WHERE key = ?", (key,)).fetchone()
        return np.frombuffer(row[0], dtype="<f4").astype(np.float32) if row else None

    def thumbnail(self, key: str) -> bytes | None:
        row = self._reader().execute("SELECT thumbnail FROM items WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row and row[0] is not None else None

    def count(self) -> int:
        (n,) = self._reader().execute("SELECT COUNT(*) FROM items").fetchone()
        return int(n)

    def keys_by_id(self, ids: Sequence[int] | None = None) -> dict[int, str]:
        """The keys of ``ids`` that are stored (None: every item's, what a migration pass
        compares), by id; nothing else read or decoded."""
        if ids is None:
            return dict(self._reader().execute("SELECT id, key FROM items").fetchall())
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        sql = f"SELECT id, key FROM items WHERE id IN ({marks})"  # noqa: S608 - only "?" marks
        return dict(self._reader().execute(sql, [int(i) for i in ids]).fetchall())

    def load_vectors(self, dim: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """All ``(ids, vectors [n, dim])``, in id order."""
        rows = self._reader().execute("SELECT id, vector FROM items ORDER BY id").fetchall()
        return _unpack(rows, dim)

    def changes_since(
        self, version: int, dim: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """What changed after ``version``: ``(written ids, their vectors, removed ids)``.

        A removed id may come back written (SQLite reuses the largest id): remove first.
        """
        rows = (
            self._reader()
            .execute("SELECT id, vector FROM items WHERE written > ? ORDER BY id", (version,))
            .fetchall()
        )
        ids, matrix = _unpack(rows, dim)
        gone = self._reader().execute("SELECT id FROM removed WHERE at > ?", (version,)).fetchall()
        return ids, matrix, np.fromiter((r[0] for r in gone), dtype=np.int64, count=len(gone))

    def vectors_by_id(self, ids: Sequence[int], dim: int) -> npt.NDArray[np.float32]:
        """The float32 vectors of ``ids``, in that order (a missing id gives a zero row)."""
        out = np.zeros((len(ids), dim), dtype=np.float32)
        if not len(ids):
            return out
        where = {int(i): n for n, i in enumerate(ids)}
        marks = ",".join("?" * len(where))
        sql = f"SELECT id, vector FROM items WHERE id IN ({marks})"  # noqa: S608 - only "?" marks
        for row_id, blob in self._reader().execute(sql, list(where)).fetchall():
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

    def ids_where(self, where: Where) -> set[int]:
        return queries.ids_where(self._reader(), where)

    def lexical(self, text: str, limit: int, where: Where | None) -> list[int]:
        return queries.lexical(self._reader(), text, limit, where)

    def timeline(self, where: Where | None) -> list[tuple[int, Any, Any, Any]]:
        return queries.timeline(self._reader(), where)

    def set_ocr(self, readings: Mapping[str, Mapping[str, Any]]) -> int:
        """Store what OCR read in existing items (key → :meth:`OCRResult.to_json` data), in
        one transaction, replacing an earlier reading; vectors are left alone. Returns how
        many of the keys were items."""
        rows = [(*ocr_row(data, key=k), k) for k, data in readings.items()]
        if not rows:
            return 0
        with self.transaction() as db:
            done = 0
            for text, lines, key in rows:
                done += db.execute(
                    "INSERT INTO ocr(id, text, lines) SELECT id, ?, ? FROM items WHERE key = ? "
                    "ON CONFLICT(id) DO UPDATE SET text = excluded.text, lines = excluded.lines",
                    (text, lines, key),
                ).rowcount
        return done

    def ocr_readings(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The OCR readings of those of ``ids`` that were read (:meth:`set_ocr`'s data)."""
        return {i: json.loads(t) for i, t in queries.ocr_readings(self._reader(), ids).items()}

    def unread_under(self, prefix: str) -> dict[str, StoredItem]:
        """The items under the folder ``prefix`` (keyed by path) that OCR never read."""
        rows = self._select(
            "path LIKE ? ESCAPE '\\' AND id NOT IN (SELECT id FROM ocr)", (like_under(prefix),)
        ).fetchall()
        return {r[2]: stored_item(r) for r in rows}

    def metadata_keys_present(self, keys: Iterable[str]) -> set[str]:
        return queries.keys_present(self._reader(), keys)

    def metadata_facets(self, *, max_keys: int = 50, max_values: int = 20) -> list[dict[str, Any]]:
        return queries.metadata_facets(self._reader(), max_keys=max_keys, max_values=max_values)

    def photo_facets(self, *, max_makes: int = 50) -> dict[str, Any]:
        return queries.photo_facets(self._reader(), max_makes=max_makes)

    def set_metadata(self, values: Mapping[str, Mapping[str, Any] | None]) -> int:
        """Replace the metadata of existing items (key → metadata) in one transaction,
        leaving their vectors alone (not a write of the vector: graphs need no catch-up).
        Returns how many items there were."""
        rows = [
            (encode(validate_metadata(m)) if m is not None else None, k) for k, m in values.items()
        ]
        if not rows:
            return 0
        with self.transaction() as db:
            done = 0
            for row in rows:
                done += db.execute("UPDATE items SET metadata = ? WHERE key = ?", row).rowcount
            db.executemany(
                "DELETE FROM fields WHERE id = (SELECT id FROM items WHERE key = ?)",
                [(k,) for k in values],
            )
            db.executemany(
                ADD_FIELDS + " WHERE key = ?",
                [(*field, k) for k, m in values.items() for field in fields_of(m)],
            )
        return done

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
        rows = (
            self._reader()
            .execute(
                "SELECT path, size, mtime_ns, error FROM failures WHERE path LIKE ? ESCAPE '\\'",
                (like_under(prefix),),
            )
            .fetchall()
        )
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    def delete_failures(self, paths: Iterable[str]) -> None:
        paths = list(paths)
        if paths:
            with self.transaction() as db:
                db.executemany("DELETE FROM failures WHERE path = ?", [(p,) for p in paths])

    def integrity_ok(self) -> bool:
        (result,) = self._reader().execute("PRAGMA integrity_check").fetchone()
        return bool(result == "ok")


def _unpack(
    rows: Sequence[tuple[int, bytes]], dim: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    matrix = np.empty((len(rows), dim), dtype=np.float32)
    for i, (_, blob) in enumerate(rows):
        matrix[i] = np.frombuffer(blob, dtype="<f4")
    return ids, matrix
