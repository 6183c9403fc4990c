"""The SQLite store's queries beyond vectors: lexical search (FTS5) and the browse timeline (a
part of :class:`~.sqlite.IndexStore`, kept apart so that module stays small, as
:mod:`.pgwords` is for PostgreSQL)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from typing import Any

from themis_clip.index.lexical import fts5_query
from themis_clip.index.metadata import comparable, validate_filters
from themis_clip.index.stores.sqlschema import FILTER_TERM, LEXICAL_SQL

__all__ = ["SQLiteQueries"]

log = logging.getLogger(__name__)


class SQLiteQueries:
    """Lexical search and the timeline over ``items`` (SQL in :mod:`.sqlschema`)."""

    def _reader(self) -> sqlite3.Connection:  # IndexStore's
        raise NotImplementedError

    def ids_matching(self, filters: Mapping[str, Any]) -> set[int]:  # IndexStore's
        raise NotImplementedError

    def lexical(self, text: str, limit: int, filters: Mapping[str, Any] | None) -> list[int]:
        """Ids of the items whose key, path or string metadata hold every word of ``text``,
        best first (BM25), at most ``limit`` (:mod:`themis_clip.index.lexical`)."""
        query = fts5_query(text)
        if query is None:
            return []
        terms = [(key, *comparable(v)) for key, v in validate_filters(filters or {}).items()]
        where = (
            " AND rowid IN (" + " INTERSECT ".join([FILTER_TERM] * len(terms)) + ")"
            if terms
            else ""
        )
        params = [query, *(p for t in terms for p in t), int(limit)]
        try:
            rows = self._reader().execute(LEXICAL_SQL.format(filters=where), params).fetchall()
        except sqlite3.OperationalError as exc:  # a query FTS5 cannot parse: none matches
            log.debug("lexical query %r: %s", query, exc)
            return []
        return [int(r[0]) for r in rows]

    def timeline(self, filters: Mapping[str, Any] | None) -> list[tuple[int, Any, Any, Any]]:
        """``(id, metadata taken, metadata mtime, mtime_ns)`` of each item matching
        ``filters`` (the browse view's order is :func:`themis_clip.index.query.newest_first`)."""
        rows = self._reader().execute(
            "SELECT i.id, t.value, m.value, i.mtime_ns FROM items i "
            "LEFT JOIN fields t ON t.id = i.id AND t.key = 'taken' "
            "LEFT JOIN fields m ON m.id = i.id AND m.key = 'mtime'"
        )
        out = [(int(r[0]), r[1], r[2], r[3]) for r in rows.fetchall()]
        if filters:
            allowed = self.ids_matching(filters)
            out = [r for r in out if r[0] in allowed]
        return out
