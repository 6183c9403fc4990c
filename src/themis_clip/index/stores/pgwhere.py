"""The PostgreSQL store's part of ``where`` filters and metadata refreshes (a mixin of
:class:`.postgres.PgStore`, which holds the connection; every value is a bound parameter)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from themis_clip.index.metadata import encode, validate_metadata
from themis_clip.index.stores.pgschema import jsonb_text
from themis_clip.index.where import Where
from themis_clip.index.wheresql import compile_postgres, pg_instant

__all__ = ["PgWhereMixin"]

_TAKEN = "(doc -> 'taken')"
_INSTANT = pg_instant(_TAKEN, _TAKEN)  # the themis_items_taken index's expression
_TAKEN_SQL = (
    f"SELECT doc ->> 'taken' FROM themis_items WHERE {_INSTANT} IS NOT NULL "  # noqa: S608
    f"ORDER BY {_INSTANT} DIRECTION LIMIT 1"
)
_MAKES_SQL = (
    "SELECT doc -> 'camera' ->> 'make' AS make, count(*) AS n FROM themis_items "
    "WHERE jsonb_typeof(doc -> 'camera' -> 'make') = 'string' GROUP BY make "
    "ORDER BY n DESC, make LIMIT %s"
)


class PgWhereMixin:
    """``ids_where`` and ``set_metadata`` over ``themis_items``."""

    def _db(self) -> AbstractContextManager[Any]:  # PgStore's
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Any]:  # PgStore's
        raise NotImplementedError

    def ids_where(self, where: Where) -> set[int]:
        """Ids whose metadata satisfies ``where`` (:mod:`..where`)."""
        sql, params = compile_postgres(where)
        with self._db() as db:
            query = f"SELECT id FROM themis_items WHERE {sql}"  # noqa: S608 - only %s marks
            return {int(r[0]) for r in db.execute(query, params).fetchall()}

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

    def photo_facets(self, *, max_makes: int = 50) -> dict[str, Any]:
        """``{"taken": {"first", "last"} | None, "makes": [{"make", "count"}]}`` for the
        page's date-range and camera pickers."""
        with self._db() as db:
            first = db.execute(_TAKEN_SQL.replace("DIRECTION", "ASC")).fetchone()
            last = db.execute(_TAKEN_SQL.replace("DIRECTION", "DESC")).fetchone()
            makes = db.execute(_MAKES_SQL, (max_makes,)).fetchall()
        return {
            "taken": {"first": first[0], "last": last[0]} if first and last else None,
            "makes": [{"make": m, "count": int(n)} for m, n in makes],
        }
