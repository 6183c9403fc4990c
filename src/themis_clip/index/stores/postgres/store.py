"""An index in PostgreSQL (the only module that imports ``psycopg``, its pool and ``pgvector``).

For deployments with several ``serve`` replicas on one index, or collections that outgrow one
file: ``--index postgresql://user:pass@host/db``. It keeps what the SQLite store keeps (items,
metadata, thumbnails, float32 vectors, the model identity, change tracking, unreadable files)
and behaves the same (``tests/integration/test_store_contract.py``: one suite, both). The
database also searches itself (pgvector's HNSW index): that is
:mod:`themis_clip.index.searchers.postgres`, on this store's connection. The schema and its
migrations are :mod:`.schema`; the reads beyond items and vectors :mod:`.queries`.

Why psycopg 3: the maintained PostgreSQL driver for Python (binary protocol, server-side
parameters, thread-safe connections, clear exception classes); ``pgvector`` (the extension
author's adapter) moves vectors as NumPy arrays in binary form.

Every write is one transaction that first bumps ``write_version`` (its row lock orders writers);
a killed client's open transaction is rolled back by the server, so nothing is half-written.
A store holds up to :data:`POOL_SIZE` connections (psycopg's pool), one per thread at a time, so
concurrent searches of one server run side by side instead of queueing behind one connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from themis_clip.errors import IndexModelMismatchError, SearchIndexError
from themis_clip.index.lexical import trigrams
from themis_clip.index.metadata import encode, validate_metadata
from themis_clip.index.stores.base import StoreKind
from themis_clip.index.stores.postgres import queries
from themis_clip.index.stores.postgres.schema import (
    INTEGRITY_SQL,
    MIGRATION_LOCK,
    MIGRATIONS,
    PG_SCHEMA_VERSION,
    TABLES,
    ensure_extension,
    first_line,
    has_halfvec,
    redact,
    schema_version,
)
from themis_clip.index.stores.rows import (
    COLUMNS,
    ItemRow,
    StoredItem,
    checked,
    like_under,
    ocr_row,
    stored_item,
)
from themis_clip.index.where import Where
from themis_clip.index.wheresql import jsonb_text

__all__ = ["PG_SCHEMA_VERSION", "PgStore", "redact", "writer_lock"]

log = logging.getLogger(__name__)

#: Connections one store opens at most (one per concurrent search or write).
POOL_SIZE = 8
#: pg_try_advisory_lock key an ``index`` run holds on its database ("themis" + 1)
WRITER_LOCK = 0x7468656D6973 + 1


@contextmanager
def writer_lock(url: str, *, connect_timeout_s: int = 10) -> Iterator[None]:
    """Hold the database's writer lock for the block: one ``index`` run at a time, as the
    SQLite index's lock file allows (a second would embed every new file again beside the first).

    A session advisory lock on a connection of its own: a killed holder's session ends and the
    server releases it.

    Raises:
        SearchIndexError: another session holds it, or the server cannot be reached.
    """
    import psycopg

    where = redact(url)
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout_s)
    except psycopg.Error as exc:
        raise SearchIndexError(
            f"cannot connect to PostgreSQL at {where}: {first_line(exc)}"
        ) from exc
    with conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (WRITER_LOCK,)).fetchone()
        if not row or not row[0]:
            raise SearchIndexError(
                f"another `themis-clip index` is updating {where}; run this one when it ends"
            )
        yield  # closing the connection ends the session, which releases the lock


class PgStore:
    """An index in a PostgreSQL database with the pgvector extension.

    Args:
        url: a libpq connection URL (``postgresql://...``).
        readonly: every transaction read-only; an unmigrated database is an error.
    """

    kind = StoreKind.POSTGRESQL

    def __init__(self, url: str, *, readonly: bool = False, connect_timeout_s: int = 10) -> None:
        self.url = url
        self.path = redact(url)
        self.readonly = readonly
        self._timeout = connect_timeout_s
        first = self._connect()  # extension and migrations, failing with the driver's message
        try:
            self.extension_version = ensure_extension(first, where=self.path, readonly=readonly)
            self._migrate(first)
        finally:
            first.close()
        from psycopg_pool import ConnectionPool

        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_SIZE,
            timeout=connect_timeout_s,
            kwargs={"autocommit": True, "connect_timeout": connect_timeout_s},
            configure=self._configure,
            check=ConnectionPool.check_connection,  # a connection the server dropped: a new one
            open=True,
        )
        self._local = threading.local()  # this thread's connection while it holds one
        self._model: str | None = None  # the model's sha256 an upsert expects (expect_model)

    @property
    def _writing(self) -> int:
        """The write_version this thread's open transaction commits as."""
        return int(self._local.writing)

    # -- connection ----------------------------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg

        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=self._timeout)
        except psycopg.Error as exc:
            raise SearchIndexError(
                f"cannot connect to PostgreSQL at {self.path}: {first_line(exc)}"
            ) from exc
        return conn

    def _configure(self, conn: Any) -> None:
        """Each pooled connection: pgvector's types, and read-only when the store is."""
        from pgvector.psycopg import register_vector

        register_vector(conn)
        if self.readonly:
            conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection of this thread's own until the block ends (the same one when nested),
        reconnected when the server dropped it; psycopg errors translated (a searcher's own
        SQL runs on it too: :mod:`themis_clip.index.searchers.postgres`)."""
        import psycopg

        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        try:
            with self._pool.connection() as conn:
                self._local.conn = conn
                try:
                    yield conn
                finally:
                    self._local.conn = None
        except psycopg.Error as exc:  # the pool's timeout too: no server to reach
            raise SearchIndexError(f"PostgreSQL ({self.path}): {first_line(exc)}") from exc

    def as_halfvec(self, vector: npt.NDArray[np.float32]) -> Any:
        """``vector`` as a query parameter of type ``halfvec`` (pgvector's adapter)."""
        from pgvector import HalfVector

        return HalfVector(vector)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> PgStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema --------------------------------------------------------------------------------

    @property
    def halfvec(self) -> bool:
        """Whether the extension has ``halfvec`` (pgvector >= 0.7): the HNSW index holds f16."""
        return has_halfvec(self.extension_version)

    def _migrate(self, conn: Any) -> None:
        import psycopg

        try:
            version = schema_version(conn)
            if version > PG_SCHEMA_VERSION:
                raise SearchIndexError(
                    f"the index at {self.path} has schema version {version}, newer than this "
                    f"themis-clip supports ({PG_SCHEMA_VERSION}); upgrade themis-onnx-clip"
                )
            if version == PG_SCHEMA_VERSION:
                return
            if self.readonly:
                raise SearchIndexError(
                    f"the index at {self.path} needs a migration; open it writable once"
                )
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                version = schema_version(conn)  # another process may have just migrated
                for target in range(version + 1, PG_SCHEMA_VERSION + 1):
                    for step in MIGRATIONS[target]:
                        conn.execute(step)
                    conn.execute(
                        "INSERT INTO themis_meta(key, value) VALUES('schema_version', %s) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (str(target),),
                    )
                conn.execute(
                    "INSERT INTO themis_meta(key, value) VALUES('write_version', '0') "
                    "ON CONFLICT(key) DO NOTHING"
                )
        except psycopg.Error as exc:
            raise SearchIndexError(
                f"cannot open the index at {self.path}: {first_line(exc)}"
            ) from exc

    @staticmethod
    def drop(url: str) -> None:
        """Delete the index's tables (``--rebuild``); other tables are left alone."""
        store = PgStore(url)
        try:
            with store.connection() as db, db.transaction():
                db.execute(f"DROP TABLE IF EXISTS {', '.join(TABLES)} CASCADE")
        finally:
            store.close()

    # -- sibling schemas (a migration's shadow and the index it replaced) -----------------------

    @property
    def schema(self) -> str:
        """The schema holding this index's tables (the connection's current schema)."""
        with self.connection() as db:
            return str(db.execute("SELECT current_schema()").fetchone()[0])

    def schemas(self, prefix: str) -> list[str]:
        """The schemas of this database whose name starts with ``prefix``, sorted."""
        with self.connection() as db:
            rows = db.execute(
                "SELECT nspname FROM pg_namespace WHERE left(nspname, length(%s)) = %s "
                "ORDER BY nspname",
                (prefix, prefix),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def sibling(self, schema: str) -> str:
        """The URL of the index in ``schema`` of this database (the schema is created when
        missing): this URL with ``schema`` first in its search path, so its tables are found
        there and pgvector's types where this index finds them."""
        from psycopg import sql

        with self.connection() as db:
            db.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            (path,) = db.execute("SELECT current_schemas(false)").fetchone()
        names = [schema, *(p for p in path if p != schema)]
        quoted = ",".join('"' + n.replace('"', '""') + '"' for n in names)
        escaped = quoted.replace("\\", "\\\\").replace(" ", "\\ ")  # libpq's options syntax
        parts = urlsplit(self.url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        options = " ".join(v for k, v in query if k == "options")
        query = [(k, v) for k, v in query if k != "options"]
        query.append(("options", f"{options} -csearch_path={escaped}".strip()))
        return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))

    def swap(self, keep_as: str, take_from: str, *, expect_version: int | None = None) -> None:
        """Move this index's tables into the schema ``keep_as`` and those of ``take_from`` into
        this index's schema, in one transaction (a reader sees the old index or the new one,
        never a mix), then drop the emptied ``take_from``.

        Args:
            expect_version: refuse when this index's ``write_version`` is another (a write
                the caller has not caught up), checked with every table locked.

        Raises:
            SearchIndexError: ``take_from`` holds no index, ``keep_as`` holds one, or the
                index was written since ``expect_version``.
        """
        import psycopg
        from psycopg import sql

        here = self.schema
        moves = [(here, keep_as), (take_from, here)]
        try:
            with self.connection() as db, db.transaction():
                locked = sql.SQL(", ").join(
                    sql.Identifier(schema, t) for schema in (here, take_from) for t in TABLES
                )
                db.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(locked))
                if expect_version is not None:
                    (version,) = db.execute(
                        "SELECT value::bigint FROM themis_meta WHERE key = 'write_version'"
                    ).fetchone()
                    if int(version) != expect_version:
                        raise SearchIndexError(
                            f"the index at {self.path} was written during the cut-over; run "
                            "the migration again (its shadow is kept and catches up)"
                        )
                db.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(keep_as))
                )
                for source, target in moves:
                    for table in TABLES:
                        db.execute(
                            sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(
                                sql.Identifier(source, table), sql.Identifier(target)
                            )
                        )
                    db.execute(
                        sql.SQL("ALTER FUNCTION {}(text) SET SCHEMA {}").format(
                            sql.Identifier(source, "themis_instant"), sql.Identifier(target)
                        )
                    )
                db.execute(sql.SQL("DROP SCHEMA {}").format(sql.Identifier(take_from)))
        except psycopg.Error as exc:
            raise SearchIndexError(
                f"cannot swap the index at {self.path} with schema {take_from!r}: {first_line(exc)}"
            ) from exc

    def drop_schema(self, schema: str) -> None:
        """Delete the schema ``schema`` with everything in it (a migration's shadow or the
        index it replaced); never this index's own."""
        from psycopg import sql

        if schema == self.schema:
            raise SearchIndexError(f"schema {schema!r} holds the live index at {self.path}")
        with self.connection() as db:
            db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One atomic write, numbered: ``write_version`` is bumped first (ordering writers)."""
        if self.readonly:
            raise SearchIndexError(f"the index at {self.path} is open read-only")
        with self.connection() as db, db.transaction():
            (version,) = db.execute(
                "UPDATE themis_meta SET value = (value::bigint + 1)::text "
                "WHERE key = 'write_version' RETURNING value::bigint"
            ).fetchone()
            self._local.writing = int(version)
            yield db

    # -- meta ----------------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        with self.connection() as db:
            return dict(db.execute("SELECT key, value FROM themis_meta").fetchall())

    def set_meta(self, values: Mapping[str, str | int]) -> None:
        with self.transaction() as db:
            for k, v in values.items():
                db.execute(
                    "INSERT INTO themis_meta(key, value) VALUES(%s, %s) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (k, str(v)),
                )
            if "dim" in values:
                self._set_dimension(db, int(values["dim"]))

    @property
    def write_version(self) -> int:
        with self.connection() as db:
            row = db.execute("SELECT value FROM themis_meta WHERE key = 'write_version'").fetchone()
        return int(row[0]) if row else 0

    def _set_dimension(self, db: Any, dim: int) -> None:
        """Give the vector column its dimension (pgvector's index needs one), once."""
        (typmod,) = db.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'themis_items'::regclass "
            "AND attname = 'embedding'"
        ).fetchone()
        if typmod == dim:
            return
        if typmod > 0:
            raise SearchIndexError(
                f"the index at {self.path} holds {typmod}-d vectors, not {dim}-d"
            )
        db.execute(f"ALTER TABLE themis_items ALTER COLUMN embedding TYPE vector({int(dim)})")

    # -- items ---------------------------------------------------------------------------------

    def expect_model(self, sha256: str) -> None:
        """Refuse later upserts if the index is then made by a model other than ``sha256``,
        checked inside each upsert's transaction: another server's migration may cut over
        between a writer's model check and its write."""
        self._model = sha256

    def _check_model(self, db: Any) -> None:
        if self._model is None:
            return
        meta = dict(
            db.execute(
                "SELECT key, value FROM themis_meta WHERE key IN ('model_id', 'model_sha256')"
            ).fetchall()
        )
        if meta.get("model_sha256", self._model) != self._model:
            raise IndexModelMismatchError(
                f"the index at {self.path} is now made by model {meta.get('model_id')} (it was "
                "migrated): load that model (POST /admin/reload) to write to it again"
            )

    def upsert(self, rows: Sequence[ItemRow], *, dim: int) -> None:
        """Insert or replace ``rows`` (matched by key) in one transaction (refused when the
        index's model is not the one :meth:`expect_model` names)."""
        if not rows:
            return
        values = []
        for r in rows:
            vec, meta = checked(r, dim)
            values.append(
                (
                    r.key,
                    r.path,
                    r.size,
                    r.mtime_ns,
                    r.sha256,
                    meta,
                    jsonb_text(meta),
                    r.thumbnail,
                    vec,
                )
            )
        with self.transaction() as db:
            self._check_model(db)
            self._set_dimension(db, dim)
            written = self._writing
            with db.cursor() as cur:
                # Other content: the text read in the old one is gone (asked only of an index
                # that has readings: one without OCR does no work for it).
                if cur.execute("SELECT 1 FROM themis_ocr LIMIT 1").fetchone() is not None:
                    cur.execute(
                        "DELETE FROM themis_ocr o USING themis_items i, "
                        "unnest(%s::text[], %s::text[]) AS n(key, sha) WHERE o.id = i.id AND "
                        "i.key = n.key AND (n.sha IS NULL OR i.sha256 IS DISTINCT FROM n.sha)",
                        ([r.key for r in rows], [r.sha256 for r in rows]),
                    )
                cur.executemany(
                    """INSERT INTO themis_items(key, path, size, mtime_ns, sha256, metadata, doc,
                                                thumbnail, embedding, written)
                       VALUES(%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s)
                       ON CONFLICT(key) DO UPDATE SET path = excluded.path,
                         size = excluded.size, mtime_ns = excluded.mtime_ns,
                         sha256 = excluded.sha256, metadata = excluded.metadata,
                         doc = excluded.doc, thumbnail = excluded.thumbnail,
                         embedding = excluded.embedding, written = excluded.written""",
                    [(*v, written) for v in values],
                )
                paths = [r.path for r in rows if r.path]
                if paths:
                    cur.execute("DELETE FROM themis_failures WHERE path = ANY(%s)", (paths,))

    def delete_keys(self, keys: Iterable[str]) -> int:
        keys = list(keys)
        if not keys:
            return 0
        with self.transaction() as db:
            gone = db.execute(
                "DELETE FROM themis_items WHERE key = ANY(%s) RETURNING id", (keys,)
            ).fetchall()
            with db.cursor() as cur:
                cur.executemany(
                    "INSERT INTO themis_removed(id, at) VALUES(%s, %s) "
                    "ON CONFLICT(id) DO UPDATE SET at = excluded.at",
                    [(i, self._writing) for (i,) in gone],
                )
            return len(gone)

    def rename(self, old_key: str, new_key: str, *, path: str, size: int, mtime_ns: int) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE themis_items SET key = %s, path = %s, size = %s, mtime_ns = %s "
                "WHERE key = %s",
                (new_key, path, size, mtime_ns, old_key),
            )

    def _select(self, where: str, params: Sequence[Any]) -> list[Any]:
        with self.connection() as db:
            # Constant SQL built here; every value is a bound parameter.
            sql = f"SELECT {COLUMNS} FROM themis_items WHERE {where}"  # noqa: S608
            return list(db.execute(sql, params).fetchall())

    def get(self, key: str) -> StoredItem | None:
        rows = self._select("key = %s", (key,))
        return stored_item(rows[0]) if rows else None

    def items_under(self, prefix: str) -> dict[str, StoredItem]:
        """Items whose path lies under the folder ``prefix`` (keyed by path)."""
        rows = self._select("path LIKE %s", (like_under(prefix),))
        return {r[2]: stored_item(r) for r in rows}

    def by_sha256(self, digest: str) -> list[StoredItem]:
        return [stored_item(r) for r in self._select("sha256 = %s", (digest,))]

    def vector(self, key: str) -> npt.NDArray[np.float32] | None:
        with self.connection() as db:
            row = db.execute("SELECT embedding FROM themis_items WHERE key = %s", (key,)).fetchone()
        return _np(row[0]) if row else None

    def thumbnail(self, key: str) -> bytes | None:
        with self.connection() as db:
            row = db.execute("SELECT thumbnail FROM themis_items WHERE key = %s", (key,)).fetchone()
        return bytes(row[0]) if row and row[0] is not None else None

    def count(self) -> int:
        with self.connection() as db:
            (n,) = db.execute("SELECT count(*) FROM themis_items").fetchone()
        return int(n)

    def keys_by_id(self, ids: Sequence[int] | None = None) -> dict[int, str]:
        """The keys of ``ids`` that are stored (None: every item's, what a migration pass
        compares), by id; nothing else read or decoded."""
        if ids is not None and not ids:
            return {}
        with self.connection() as db:
            rows = (
                db.execute("SELECT id, key FROM themis_items")
                if ids is None
                else db.execute(
                    "SELECT id, key FROM themis_items WHERE id = ANY(%s)", ([int(i) for i in ids],)
                )
            )
            return {int(i): str(k) for i, k in rows}

    def _vectors(self, sql: str, params: Sequence[Any], dim: int) -> tuple[Any, Any]:
        with self.connection() as db, db.cursor(binary=True) as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        matrix = np.empty((len(rows), dim), dtype=np.float32)
        for i, (_, vec) in enumerate(rows):
            matrix[i] = _np(vec)
        return ids, matrix

    def load_vectors(self, dim: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """All ``(ids, vectors [n, dim])``, in id order."""
        ids, matrix = self._vectors("SELECT id, embedding FROM themis_items ORDER BY id", (), dim)
        return ids, matrix

    def changes_since(
        self, version: int, dim: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """What changed after ``version``: ``(written ids, their vectors, removed ids)``."""
        ids, matrix = self._vectors(
            "SELECT id, embedding FROM themis_items WHERE written > %s ORDER BY id",
            (version,),
            dim,
        )
        with self.connection() as db:
            gone = db.execute("SELECT id FROM themis_removed WHERE at > %s", (version,)).fetchall()
        return ids, matrix, np.fromiter((r[0] for r in gone), dtype=np.int64, count=len(gone))

    def rows_by_id(
        self, ids: Sequence[int], dim: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """``(ids, vectors)`` of those of ``ids`` that are stored, in id order."""
        if not len(ids):
            return np.empty(0, np.int64), np.empty((0, dim), np.float32)
        found, matrix = self._vectors(
            "SELECT id, embedding FROM themis_items WHERE id = ANY(%s) ORDER BY id",
            ([int(i) for i in ids],),
            dim,
        )
        return found, matrix

    def vectors_by_id(self, ids: Sequence[int], dim: int) -> npt.NDArray[np.float32]:
        """The float32 vectors of ``ids``, in that order (a missing id gives a zero row)."""
        out = np.zeros((len(ids), dim), dtype=np.float32)
        if not len(ids):
            return out
        where = {int(i): n for n, i in enumerate(ids)}
        found, matrix = self._vectors(
            "SELECT id, embedding FROM themis_items WHERE id = ANY(%s)", (list(where),), dim
        )
        for i, row in zip(found, matrix, strict=True):
            out[where[int(i)]] = row
        return out

    def size_bytes(self) -> int:
        """The index's tables with their indexes and TOAST, as PostgreSQL counts them."""
        with self.connection() as db:
            sql = "SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) AS c"
            (n,) = db.execute(sql, (list(TABLES),)).fetchone()
        return int(n or 0)

    def items_by_id(self, ids: Sequence[int]) -> dict[int, StoredItem]:
        if not ids:
            return {}
        rows = self._select("id = ANY(%s)", ([int(i) for i in ids],))
        return {int(r[0]): stored_item(r) for r in rows}

    def ids_where(self, where: Where) -> set[int]:
        with self.connection() as db:
            return queries.ids_where(db, where)

    def lexical(self, text: str, limit: int, where: Where | None) -> list[int]:
        with self.connection() as db:
            return queries.lexical(db, text, limit, where)

    def set_ocr(self, readings: Mapping[str, Mapping[str, Any]]) -> int:
        """Store what OCR read in existing items (key → :meth:`OCRResult.to_json` data), in
        one transaction, replacing an earlier reading; vectors are left alone. Returns how
        many of the keys were items."""
        rows = []
        for key, data in readings.items():
            text, lines = ocr_row(data, key=key)
            grams = sorted({g for w in text.split() for g in trigrams(w)})
            rows.append((text, jsonb_text(lines), grams, key))
        if not rows:
            return 0
        done = 0
        with self.transaction() as db:
            for row in rows:
                done += db.execute(
                    "INSERT INTO themis_ocr(id, text, lines, grams) "
                    "SELECT id, %s, %s::jsonb, %s FROM themis_items WHERE key = %s "
                    "ON CONFLICT(id) DO UPDATE SET text = excluded.text, lines = excluded.lines, "
                    "grams = excluded.grams",
                    row,
                ).rowcount
        return done

    def ocr_readings(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The OCR readings of those of ``ids`` that were read (:meth:`set_ocr`'s data)."""
        with self.connection() as db:
            return queries.ocr_readings(db, ids)

    def unread_under(self, prefix: str) -> dict[str, StoredItem]:
        """The items under the folder ``prefix`` (keyed by path) that OCR never read."""
        rows = self._select(
            "path LIKE %s AND NOT EXISTS (SELECT 1 FROM themis_ocr o WHERE o.id = themis_items.id)",
            (like_under(prefix),),
        )
        return {r[2]: stored_item(r) for r in rows}

    def timeline(self, where: Where | None) -> list[tuple[int, Any, Any, Any]]:
        with self.connection() as db:
            return queries.timeline(db, where)

    def metadata_keys_present(self, keys: Iterable[str]) -> set[str]:
        with self.connection() as db:
            return queries.keys_present(db, keys)

    def metadata_facets(self, *, max_keys: int = 50, max_values: int = 20) -> list[dict[str, Any]]:
        with self.connection() as db:
            return queries.metadata_facets(db, max_keys=max_keys, max_values=max_values)

    def photo_facets(self, *, max_makes: int = 50) -> dict[str, Any]:
        with self.connection() as db:
            return queries.photo_facets(db, max_makes=max_makes)

    def set_metadata(self, values: Mapping[str, Mapping[str, Any] | None]) -> int:
        """Replace the metadata of existing items (key → metadata), vectors untouched (the
        HNSW index needs nothing). Returns how many items there were."""
        rows = []
        for key, meta in values.items():
            text = encode(validate_metadata(meta)) if meta is not None else None
            rows.append((text, jsonb_text(text), key))
        if not rows:
            return 0
        done = 0
        with self.transaction() as db:
            for row in rows:
                done += db.execute(
                    "UPDATE themis_items SET metadata = %s, doc = %s::jsonb WHERE key = %s", row
                ).rowcount
        return done

    # -- failures ------------------------------------------------------------------------------

    def record_failures(self, rows: Sequence[tuple[str, int, int, str]]) -> None:
        if rows:
            with self.transaction() as db, db.cursor() as cur:
                cur.executemany(
                    "INSERT INTO themis_failures(path, size, mtime_ns, error) "
                    "VALUES(%s, %s, %s, %s) ON CONFLICT(path) DO UPDATE SET size = excluded.size, "
                    "mtime_ns = excluded.mtime_ns, error = excluded.error",
                    rows,
                )

    def failures_under(self, prefix: str) -> dict[str, tuple[int, int, str]]:
        with self.connection() as db:
            rows = db.execute(
                "SELECT path, size, mtime_ns, error FROM themis_failures WHERE path LIKE %s",
                (like_under(prefix),),
            ).fetchall()
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    def delete_failures(self, paths: Iterable[str]) -> None:
        paths = list(paths)
        if paths:
            with self.transaction() as db:
                db.execute("DELETE FROM themis_failures WHERE path = ANY(%s)", (paths,))

    def integrity_ok(self) -> bool:
        """Whether the tables agree with each other (what a torn write would break): one
        ``write_version``, no row written after it, no removed id still present, a ``doc``
        exactly where there is ``metadata``, and every vector of the index's dimension."""
        with self.connection() as db:
            (ok,) = db.execute(INTEGRITY_SQL).fetchone()
        return bool(ok)


def _np(value: Any) -> npt.NDArray[np.float32]:
    """A pgvector value (its adapter's ``Vector``) as a float32 array."""
    array = value.to_numpy() if hasattr(value, "to_numpy") else value
    return np.asarray(array, dtype=np.float32)
