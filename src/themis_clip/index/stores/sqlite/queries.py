"""The SQLite store's reads beyond items and vectors, as functions of a connection: ``where``
filters, lexical search (FTS5), the browse timeline and the facets (every value bound; the
schema is :mod:`.schema`'s)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from themis_clip.index.lexical import (
    TOLERANT_MIN_CHARS,
    fts5_query,
    interleave,
    ocr_score,
    ocr_words,
    trigrams,
)
from themis_clip.index.where import Where
from themis_clip.index.wheresql import compile_sqlite, sqlite_instant, sqlite_text

__all__ = [
    "ids_where",
    "keys_present",
    "lexical",
    "metadata_facets",
    "ocr_lexical",
    "ocr_readings",
    "photo_facets",
    "timeline",
]

log = logging.getLogger(__name__)

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
#: How many items sharing a trigram with a query a tolerant OCR match looks at, at most.
_TOLERANT_CANDIDATES = 1000
#: Ranked ids of the items matching an FTS5 query (bound: the query, then the limit); best
#: first by BM25, ties by id. ``{where}`` is empty or `` AND rowid IN (...)``.
_LEXICAL_SQL = (
    "SELECT rowid FROM lexical WHERE lexical MATCH ?{where} ORDER BY bm25(lexical), rowid LIMIT ?"
)


def _matching(where: Where | None, column: str) -> tuple[str, list[Any]]:
    """`` AND column IN (the ids matching where)`` and its parameters (nothing for None)."""
    if where is None:
        return "", []
    sql, params = compile_sqlite(where)
    # The compiled text holds only constant SQL and "?" marks.
    return f" AND {column} IN (SELECT id FROM items WHERE {sql})", params  # noqa: S608


def ids_where(db: sqlite3.Connection, where: Where) -> set[int]:
    """Ids whose metadata satisfies ``where`` (:mod:`themis_clip.index.where`)."""
    sql, params = compile_sqlite(where)
    query = f"SELECT id FROM items WHERE {sql}"  # noqa: S608 - constant SQL and "?" marks
    return {r[0] for r in db.execute(query, params).fetchall()}


def lexical(db: sqlite3.Connection, text: str, limit: int, where: Where | None) -> list[int]:
    """Ids of the items matching ``where`` whose key, path or string metadata hold every word
    of ``text`` (best first by BM25), merged with those whose OCR text holds them
    (:func:`ocr_lexical`), at most ``limit`` (:mod:`themis_clip.index.lexical`)."""
    by_words: list[int] = []
    query = fts5_query(text)
    if query is not None:
        clause, params = _matching(where, "rowid")
        try:
            rows = db.execute(_LEXICAL_SQL.format(where=clause), [query, *params, int(limit)])
            by_words = [int(r[0]) for r in rows.fetchall()]
        except sqlite3.OperationalError as exc:  # a query FTS5 cannot parse: none matches
            log.debug("lexical query %r: %s", query, exc)
    return interleave([by_words, ocr_lexical(db, text, limit, where)])[:limit]


def _phrase(word: str) -> str:
    return '"' + word.replace('"', '""') + '"'


def ocr_lexical(db: sqlite3.Connection, text: str, limit: int, where: Where | None) -> list[int]:
    """Ids of the items matching ``where`` whose OCR text holds every word of ``text`` as a
    substring (best first by BM25 over trigrams), then, when fewer than ``limit``, those
    that hold them tolerantly (best similarity first). An index without readings answers
    after one probe."""
    words = ocr_words(text)
    if not words:
        return []
    if db.execute("SELECT 1 FROM ocr LIMIT 1").fetchone() is None:
        return []
    clause, params = _matching(where, "rowid")
    long = [w for w in words if len(w) >= 3]
    short = [w for w in words if len(w) < 3]  # no trigram: checked on the rows found
    checks = "".join(" AND instr(text, ?) > 0" for _ in short)  # text is folded
    if long:
        sql = (
            "SELECT rowid FROM ocr_lexical WHERE ocr_lexical MATCH ?"  # noqa: S608
            f"{checks}{clause} ORDER BY bm25(ocr_lexical), rowid LIMIT ?"
        )
        first: list[Any] = [" AND ".join(_phrase(w) for w in long)]
    else:
        sql = (
            "SELECT rowid FROM ocr_lexical WHERE text <> ''"  # noqa: S608
            f"{checks}{clause} ORDER BY rowid LIMIT ?"
        )
        first = []
    found = [int(r[0]) for r in db.execute(sql, [*first, *short, *params, int(limit)])]
    tolerant = [w for w in words if len(w) >= TOLERANT_MIN_CHARS]
    if len(found) >= limit or not tolerant:
        return found
    grams = sorted({g for w in tolerant for g in trigrams(w, padded=False)})
    rows = db.execute(
        f"SELECT rowid, text FROM ocr_lexical WHERE ocr_lexical MATCH ?{clause} "  # noqa: S608
        "ORDER BY bm25(ocr_lexical), rowid LIMIT ?",
        [" OR ".join(_phrase(g) for g in grams), *params, _TOLERANT_CANDIDATES],
    ).fetchall()
    seen = set(found)
    scored = [(ocr_score(words, t), int(i)) for i, t in rows if int(i) not in seen]
    close = sorted((-score, i) for score, i in scored if score > 0)
    return found + [i for _, i in close][: limit - len(found)]


def ocr_readings(db: sqlite3.Connection, ids: Sequence[int]) -> dict[int, str]:
    """The stored OCR readings (JSON text) of those of ``ids`` that were read."""
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    sql = f"SELECT id, lines FROM ocr WHERE id IN ({marks})"  # noqa: S608 - only "?" marks
    return {int(i): t for i, t in db.execute(sql, [int(i) for i in ids]).fetchall()}


def timeline(db: sqlite3.Connection, where: Where | None) -> list[tuple[int, Any, Any, Any]]:
    """``(id, metadata taken, metadata mtime, mtime_ns)`` of each item matching ``where`` (the
    browse view's order is :func:`themis_clip.index.query.newest_first`)."""
    clause, params = _matching(where, "i.id")
    rows = db.execute(
        "SELECT i.id, t.value, m.value, i.mtime_ns FROM items i "  # noqa: S608 - constant SQL
        "LEFT JOIN fields t ON t.id = i.id AND t.key = 'taken' "
        f"LEFT JOIN fields m ON m.id = i.id AND m.key = 'mtime' WHERE TRUE{clause}",
        params,
    )
    return [(int(r[0]), r[1], r[2], r[3]) for r in rows.fetchall()]


def keys_present(db: sqlite3.Connection, keys: Iterable[str]) -> set[str]:
    """Which of ``keys`` some item's metadata has at its top level (one index probe each)."""
    return {
        key
        for key in dict.fromkeys(keys)
        if db.execute("SELECT 1 FROM fields WHERE key = ? LIMIT 1", (key,)).fetchone()
    }


def metadata_facets(
    db: sqlite3.Connection, *, max_keys: int = 50, max_values: int = 20
) -> list[dict[str, Any]]:
    """The top-level metadata keys, most common first, with how many items have each and
    their most common scalar values (``max_values`` 0: the keys only)."""
    keys = db.execute(
        "SELECT key, COUNT(*) AS n FROM fields GROUP BY key ORDER BY n DESC, key LIMIT ?",
        (max_keys,),
    ).fetchall()
    out = []
    for key, count in keys:
        rows = []
        if max_values > 0:
            rows = db.execute(
                "SELECT value, kind, COUNT(*) AS n FROM fields WHERE key = ? "
                "AND kind NOT IN ('object', 'array') "
                "GROUP BY kind, value ORDER BY n DESC, value LIMIT ?",
                (key, max_values + 1),
            ).fetchall()
        # A field's SQL value as the JSON scalar it came from (booleans are 1/0 there).
        values = [{"value": bool(v) if k == "bool" else v, "count": n} for v, k, n in rows]
        out.append(
            {
                "key": key,
                "count": count,
                "values": values[:max_values],
                "more_values": len(values) > max_values,
            }
        )
    return out


def photo_facets(db: sqlite3.Connection, *, max_makes: int = 50) -> dict[str, Any]:
    """``{"taken": {"first", "last"} | None, "makes": [{"make", "count"}]}`` for the page's
    date-range and camera pickers (index reads, not a scan of the JSON)."""
    first = db.execute(_TAKEN_SQL.replace("DIRECTION", "ASC")).fetchone()
    last = db.execute(_TAKEN_SQL.replace("DIRECTION", "DESC")).fetchone()
    makes = db.execute(_MAKES_SQL, (max_makes,)).fetchall()
    return {
        "taken": {"first": first[0], "last": last[0]} if first and last else None,
        "makes": [{"make": m, "count": n} for m, n in makes],
    }
