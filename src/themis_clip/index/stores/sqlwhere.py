"""The SQLite store's part of ``where`` filters, metadata refreshes and photo facets (a mixin
of :class:`.sqlite.IndexStore`, which holds the connections; every value is bound)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from themis_clip.index.metadata import encode, validate_metadata
from themis_clip.index.stores.sqlschema import ADD_FIELDS, fields_of
from themis_clip.index.where import Where
from themis_clip.index.wheresql import compile_sqlite, sqlite_instant, sqlite_text

__all__ = ["SQLiteWhereMixin"]

_TAKEN = "'$.taken'"
_INSTANT = sqlite_instant(_TAKEN, _TAKEN, _TAKEN)  # the items_taken index's expression
# Constant SQL: the first and last photo by instant (the index answers each), and the makes.
_TAKEN_SQL = (
    f"SELECT json_extract(metadata, '$.taken') FROM items WHERE {_INSTANT} IS NOT NULL "  # noqa: S608
    f"ORDER BY {_INSTANT} DIRECTION LIMIT 1"
)
_MAKE = sqlite_text("'$.camera.make'", "'$.camera.make'")  # the items_camera index's
_MAKES_SQL = (
    f"SELECT {_MAKE} AS make, count(*) AS n FROM items WHERE make IS NOT NULL "  # noqa: S608
    "GROUP BY make ORDER BY n DESC, make LIMIT ?"
)


class SQLiteWhereMixin:
    """``ids_where``, ``set_metadata`` and ``photo_facets`` over ``items``."""

    def _reader(self) -> sqlite3.Connection:  # IndexStore's
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:  # IndexStore's
        raise NotImplementedError

    def ids_where(self, where: Where) -> set[int]:
        """Ids whose metadata satisfies ``where`` (:mod:`..where`; every value bound)."""
        sql, params = compile_sqlite(where)
        # The compiled text holds only constant SQL and "?" marks.
        query = f"SELECT id FROM items WHERE {sql}"  # noqa: S608
        return {r[0] for r in self._reader().execute(query, params).fetchall()}

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

    def photo_facets(self, *, max_makes: int = 50) -> dict[str, Any]:
        """``{"taken": {"first", "last"} | None, "makes": [{"make", "count"}]}`` for the
        page's date-range and camera pickers (index reads, not a scan of the JSON)."""
        db = self._reader()
        first = db.execute(_TAKEN_SQL.replace("DIRECTION", "ASC")).fetchone()
        last = db.execute(_TAKEN_SQL.replace("DIRECTION", "DESC")).fetchone()
        makes = db.execute(_MAKES_SQL, (max_makes,)).fetchall()
        return {
            "taken": {"first": first[0], "last": last[0]} if first and last else None,
            "makes": [{"make": m, "count": n} for m, n in makes],
        }
