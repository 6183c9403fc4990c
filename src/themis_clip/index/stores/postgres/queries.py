"""The PostgreSQL store's reads beyond items and vectors, as functions of a (psycopg)
connection: ``where`` filters, lexical search, the browse timeline and the facets (every value
a bound parameter; the schema is :mod:`.schema`'s)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from themis_clip.index.lexical import (
    TOLERANT_MIN_CHARS,
    interleave,
    ocr_score,
    ocr_words,
    trigrams,
)
from themis_clip.index.where import Where
from themis_clip.index.wheresql import compile_postgres, pg_instant

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

#: Which of the keys (a text[]) some item's ``doc`` has.
_KEYS_PRESENT_SQL = (
    "SELECT DISTINCT k FROM (SELECT doc FROM themis_items WHERE doc ?| %(keys)s::text[]) AS d, "
    "unnest(%(keys)s::text[]) AS k WHERE d.doc ? k"
)
#: The most common top-level keys and how many items have each.
_FACET_KEYS_SQL = (
    "SELECT e.key, count(*) AS n FROM themis_items, jsonb_each(doc) AS e "
    "WHERE jsonb_typeof(doc) = 'object' GROUP BY e.key ORDER BY n DESC, e.key LIMIT %s"
)
#: One key's most common scalar values, over the items that have the key (GIN).
_FACET_VALUES_SQL = (
    "SELECT doc -> %s AS v, count(*) AS n FROM themis_items WHERE doc ? %s "
    "AND jsonb_typeof(doc -> %s) NOT IN ('object', 'array') GROUP BY v ORDER BY n DESC, v "
    "LIMIT %s"
)
#: Ranked ids of the items holding every word of the query (bound: query, where, limit), best
#: first by ``ts_rank_cd``, ties by id. The query's text is read as the documents are (``/``,
#: ``.``, ``-`` as spaces) and as plain words, all required, so no operator syntax is
#: interpreted (as in SQLite's quoted FTS5 words).
_LEXICAL_SQL = (
    "SELECT id FROM themis_items, "
    "plainto_tsquery('simple', translate(%s, '/.-', '   ')) AS q "
    "WHERE lexical @@ q{where} ORDER BY ts_rank_cd(lexical, q) DESC, id LIMIT %s"
)
#: Ids of the items whose OCR trigrams hold the query words' (bound: the trigrams, one
#: ``strpos`` word per check, where, limit; ``{where}``: empty or `` AND id IN (...)``), best
#: first by how little text there is around the words, ties by id; the trigram test lets the
#: GIN index find candidates, ``strpos`` decides.
_OCR_SQL = (
    "SELECT id FROM themis_ocr WHERE grams @> %s::text[]{checks}{where} "
    "ORDER BY length(text), id LIMIT %s"
)
#: Items sharing a trigram with the query (a tolerant match's candidates), most shared first.
_OCR_CANDIDATES_SQL = (
    "SELECT id, text FROM themis_ocr WHERE grams && %s::text[]{where} "
    "ORDER BY cardinality(ARRAY(SELECT unnest(grams) INTERSECT SELECT unnest(%s::text[]))) "
    "DESC, id LIMIT %s"
)
_TOLERANT_CANDIDATES = 1000
_IDS_SQL = "SELECT id FROM themis_items WHERE TRUE{where}"
_TIMELINE_SQL = (
    "SELECT id, doc -> 'taken', doc -> 'mtime', mtime_ns FROM themis_items WHERE TRUE{where}"
)
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


def _rows(db: Any, sql: str, before: list[Any], where: Where | None, after: list[Any]) -> Any:
    clause, params = compile_postgres(where) if where is not None else ("", [])
    query = sql.format(where=f" AND {clause}" if clause else "")
    return db.execute(query, [*before, *params, *after]).fetchall()


def ids_where(db: Any, where: Where) -> set[int]:
    """Ids whose metadata satisfies ``where`` (:mod:`themis_clip.index.where`)."""
    return {
        int(r[0]) for r in _rows(db, "SELECT id FROM themis_items WHERE TRUE{where}", [], where, [])
    }


def lexical(db: Any, text: str, limit: int, where: Where | None) -> list[int]:
    """Ids of the items matching ``where`` whose key, path or string metadata hold every word
    of ``text`` (best first by ``ts_rank_cd``), merged with those whose OCR text holds them
    (:func:`ocr_lexical`), at most ``limit``."""
    by_words = [int(r[0]) for r in _rows(db, _LEXICAL_SQL, [text], where, [int(limit)])]
    return interleave([by_words, ocr_lexical(db, text, limit, where)])[:limit]


def ocr_lexical(db: Any, text: str, limit: int, where: Where | None) -> list[int]:
    """Ids of the items matching ``where`` whose OCR text holds every word of ``text`` as a
    substring, then, when fewer than ``limit``, those that hold them tolerantly (best
    similarity first; :mod:`themis_clip.index.lexical`)."""
    words = ocr_words(text)
    if not words or db.execute("SELECT 1 FROM themis_ocr LIMIT 1").fetchone() is None:
        return []
    grams = sorted({g for w in words if len(w) >= 3 for g in trigrams(w, padded=False)})
    checks = " AND strpos(text, %s) > 0" * len(words)  # text is folded
    # A filter reads the items (their metadata); no filter, no join.
    clause, params = compile_postgres(where) if where is not None else ("", [])
    within = f" AND id IN (SELECT id FROM themis_items WHERE {clause})" if clause else ""  # noqa: S608
    sql = _OCR_SQL.format(checks=checks, where=within)
    found = [int(r[0]) for r in db.execute(sql, [grams, *words, *params, int(limit)])]
    tolerant = [w for w in words if len(w) >= TOLERANT_MIN_CHARS]
    if len(found) >= limit or not tolerant:
        return found
    # Candidates share a trigram inside a word (as on SQLite): the padded ones at the words'
    # ends would bring every item whose text has a word starting with the same letter.
    inner = sorted({g for w in tolerant for g in trigrams(w, padded=False)})
    sql = _OCR_CANDIDATES_SQL.format(where=within)
    rows = db.execute(sql, [inner, *params, inner, _TOLERANT_CANDIDATES]).fetchall()
    seen = set(found)
    scored = [(ocr_score(words, t), int(i)) for i, t in rows if int(i) not in seen]
    close = sorted((-score, i) for score, i in scored if score > 0)
    return found + [i for _, i in close][: limit - len(found)]


def ocr_readings(db: Any, ids: Sequence[int]) -> dict[int, Any]:
    """The stored OCR readings of those of ``ids`` that were read."""
    if not ids:
        return {}
    rows = db.execute(
        "SELECT id, lines FROM themis_ocr WHERE id = ANY(%s)", ([int(i) for i in ids],)
    ).fetchall()
    return {int(i): lines for i, lines in rows}


def timeline(db: Any, where: Where | None) -> list[tuple[int, Any, Any, Any]]:
    """``(id, metadata taken, metadata mtime, mtime_ns)`` of each item matching ``where``."""
    return [(int(r[0]), r[1], r[2], r[3]) for r in _rows(db, _TIMELINE_SQL, [], where, [])]


def keys_present(db: Any, keys: Iterable[str]) -> set[str]:
    """Which of ``keys`` some item's metadata has at its top level (the GIN index answers
    each ``?``), in one round trip."""
    rows = db.execute(_KEYS_PRESENT_SQL, {"keys": list(dict.fromkeys(keys))}).fetchall()
    return {r[0] for r in rows}


def metadata_facets(db: Any, *, max_keys: int = 50, max_values: int = 20) -> list[dict[str, Any]]:
    """The top-level metadata keys, most common first, with their most common scalars
    (``max_values`` 0: the keys only, one query)."""
    out = []
    for key, count in db.execute(_FACET_KEYS_SQL, (max_keys,)).fetchall():
        rows = []
        if max_values > 0:
            rows = db.execute(_FACET_VALUES_SQL, (key, key, key, max_values + 1)).fetchall()
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


def photo_facets(db: Any, *, max_makes: int = 50) -> dict[str, Any]:
    """``{"taken": {"first", "last"} | None, "makes": [{"make", "count"}]}`` for the page's
    date-range and camera pickers."""
    first = db.execute(_TAKEN_SQL.replace("DIRECTION", "ASC")).fetchone()
    last = db.execute(_TAKEN_SQL.replace("DIRECTION", "DESC")).fetchone()
    makes = db.execute(_MAKES_SQL, (max_makes,)).fetchall()
    return {
        "taken": {"first": first[0], "last": last[0]} if first and last else None,
        "makes": [{"make": m, "count": int(n)} for m, n in makes],
    }
