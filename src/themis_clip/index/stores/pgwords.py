"""The PostgreSQL store's queries beyond vectors: lexical search, the browse timeline and the
metadata facets (a part of :class:`~.postgres.PgStore`, kept apart so that module stays small)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from themis_clip.index.stores.pgschema import (
    FACET_KEYS_SQL,
    FACET_VALUES_SQL,
    LEXICAL_SQL,
    TIMELINE_SQL,
    filter_sql,
)

__all__ = ["PgQueries"]


class PgQueries:
    """Lexical search, the timeline and the metadata facets over ``themis_items`` (SQL in
    :mod:`.pgschema`)."""

    _db: Callable[[], AbstractContextManager[Any]]

    def lexical(self, text: str, limit: int, filters: Mapping[str, Any] | None) -> list[int]:
        """Ids of the items whose key, path or string metadata hold every word of ``text``,
        best first (``ts_rank_cd``), at most ``limit``."""
        return [int(r[0]) for r in self._rows(LEXICAL_SQL, [text], filters, [int(limit)])]

    def timeline(self, filters: Mapping[str, Any] | None) -> list[tuple[int, Any, Any, Any]]:
        """``(id, metadata taken, metadata mtime, mtime_ns)`` of each item matching
        ``filters``."""
        return [(int(r[0]), r[1], r[2], r[3]) for r in self._rows(TIMELINE_SQL, [], filters, [])]

    def _rows(
        self, sql: str, before: list[Any], filters: Mapping[str, Any] | None, after: list[Any]
    ) -> list[Any]:
        where, params = filter_sql(filters) if filters else ("", [])
        with self._db() as db:
            query = sql.format(filters=f" AND ({where})" if where else "")
            return list(db.execute(query, [*before, *params, *after]).fetchall())

    def metadata_facets(self, *, max_keys: int = 50, max_values: int = 20) -> list[dict[str, Any]]:
        """The top-level metadata keys, most common first, with their most common scalars
        (``max_values`` 0: the keys only, one query)."""
        with self._db() as db:
            keys = db.execute(FACET_KEYS_SQL, (max_keys,)).fetchall()
            out = []
            for key, count in keys:
                rows = []
                if max_values > 0:  # the items with the key (GIN), not every item's pairs
                    rows = db.execute(FACET_VALUES_SQL, (key, key, key, max_values + 1)).fetchall()
                values = [{"value": value, "count": int(n)} for value, n in rows]
                out.append(
                    {
                        "key": key,
                        "count": int(count),
                        "values": values[:max_values],
                        "more_values": len(values) > max_values,
                    }
                )
        return out
