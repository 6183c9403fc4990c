"""Queries beyond one vector: arithmetic, lexical and hybrid search, browsing, and pages.

- **Arithmetic** (rclip's semantics): the query vector is the normalised weighted sum of the
  parts' normalised vectors (:func:`combine`); "subtract" is a part of weight -1. The parts'
  vectors come from the caller (the server or the CLI embeds text and images; the index never
  imports model code); an item's stored vector is :meth:`Store.vector`.
- **Modes** (:class:`QueryMode`): ``vector`` (cosine similarity), ``lexical`` (the store's
  full-text index over key, path and string metadata: :mod:`.lexical`), ``hybrid`` (both,
  fused by reciprocal rank), ``browse`` (no query: the library newest first).
- **Pages** (:func:`search_page`): the cursor scheme of :mod:`.paging`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from themis_clip.errors import InputError
from themis_clip.index.lexical import MAX_QUERY_CHARS, fuse, matched_lines
from themis_clip.index.paging import (
    PAGE_WINDOW,
    Cursor,
    decode_cursor,
    encode_cursor,
    fingerprint,
    window,
)
from themis_clip.index.stores.base import Lexical
from themis_clip.index.where import Where, parse_where

if TYPE_CHECKING:
    from themis_clip.index.search import Hit, VectorIndex

__all__ = ["Page", "QueryMode", "combine", "layered", "newest_first", "search_page"]


class QueryMode(StrEnum):
    """What a search ranks by."""

    VECTOR = "vector"
    HYBRID = "hybrid"
    LEXICAL = "lexical"
    BROWSE = "browse"


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of results; ``next`` continues the query (None: this was the last page)."""

    hits: list[Hit]
    next: str | None


def combine(parts: Sequence[tuple[npt.NDArray[np.float32], float]]) -> npt.NDArray[np.float32]:
    """The query vector of ``(vector, weight)`` parts: the normalised weighted sum of the
    parts' normalised vectors.

    Returns:
        A unit float32 vector of the parts' dimension.

    Raises:
        InputError: no parts, parts of different dimensions, a zero, NaN or infinite vector
            or weight, or parts that cancel out.
    """
    if not parts:
        raise InputError("query: give at least one part")
    for i, (_, weight) in enumerate(parts):
        if not math.isfinite(weight) or weight == 0:
            raise InputError(f"query[{i}].weight: must be a finite, non-zero number")
    scale = max(abs(w) for _, w in parts)  # weights only scale: 1e300 and 1e-300 are fine
    total: npt.NDArray[np.float64] | None = None
    for i, (vector, raw) in enumerate(parts):
        weight = raw / scale
        v = np.asarray(vector, dtype=np.float64).reshape(-1)
        norm = float(np.linalg.norm(v))
        if not math.isfinite(norm) or norm == 0:
            raise InputError(f"query[{i}]: its vector is zero, NaN or infinite")
        if total is not None and v.shape != total.shape:
            raise InputError(f"query[{i}]: {v.size} dimensions, the first part {total.size}")
        total = weight * v / norm if total is None else total + weight * v / norm
    assert total is not None
    norm = float(np.linalg.norm(total))
    if not norm > 1e-6:
        raise InputError("query: the parts cancel out (their weighted sum is zero)")
    return (total / norm).astype(np.float32)


def _seconds(value: Any) -> float | None:
    """A time as seconds since the epoch: a number (seconds; larger ones read as ms, µs or
    ns), a numeric string, or an ISO 8601 date (naive: UTC). None: not a time."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            try:
                when = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                try:  # EXIF's own form: 2024:05:01 12:00:00
                    when = datetime.strptime(text[:19], "%Y:%m:%d %H:%M:%S")
                except ValueError:
                    return None
            return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    seconds = float(value)
    while abs(seconds) > 1e11:  # milliseconds, microseconds or nanoseconds
        seconds /= 1000
    return seconds


def newest_first(rows: Sequence[tuple[int, Any, Any, Any]]) -> list[int]:
    """Ids of ``(id, taken, mtime, mtime_ns)`` rows newest first: by metadata ``taken`` where
    it is a time, else metadata ``mtime``, else the file's ``mtime_ns``; items with none come
    after, newest inserted (highest id) first."""

    def when(row: tuple[int, Any, Any, Any]) -> tuple[int, float, int]:
        for value in row[1:3]:
            seconds = _seconds(value)
            if seconds is not None:
                return 1, seconds, row[0]
        if isinstance(row[3], int) and not isinstance(row[3], bool):
            return 1, row[3] / 1e9, row[0]
        return 0, 0.0, row[0]

    return [row[0] for row in sorted(rows, key=when, reverse=True)]


#: ``newest`` is the library view (capture time, else file time); ``taken`` and ``-taken`` order
#: by capture time alone, items without one last in both directions.
BROWSE_ORDERS = ("newest", "-taken", "taken", "mtime", "name")


def _browse_order(
    index: VectorIndex, rows: Sequence[tuple[int, Any, Any, Any]], order: str
) -> list[int]:
    """Ids of the timeline ``rows`` in ``order``."""
    if order not in BROWSE_ORDERS:
        raise InputError(f"order {order!r}: one of {', '.join(BROWSE_ORDERS)}")
    if order == "newest":
        return newest_first(rows)
    if order in ("taken", "-taken"):
        taken = {row[0]: _seconds(row[1]) for row in rows}
        dated = sorted(
            (i for i, t in taken.items() if t is not None),
            key=lambda i: (taken[i], i),
            reverse=order == "-taken",
        )
        return dated + [i for i in newest_first(rows) if taken[i] is None]
    if order == "mtime":
        return newest_first([(r[0], None, r[2], r[3]) for r in rows])
    items = index.store.items_by_id([r[0] for r in rows])
    return sorted(items, key=lambda i: (Path(items[i].path or items[i].key).name.lower(), i))


def search_page(
    index: VectorIndex,
    *,
    mode: QueryMode,
    k: int,
    identity: Mapping[str, Any],
    vector: npt.NDArray[np.float32] | None = None,
    text: str | None = None,
    cursor: str | None = None,
    exclude: frozenset[str] = frozenset(),
    where: Mapping[str, Any] | Where | None = None,
    order: str = "newest",
) -> Page:
    """One page of a query's results.

    Args:
        index: the index searched.
        mode: what to rank by; ``vector`` needs ``vector``, ``lexical`` needs ``text``,
            ``hybrid`` both, ``browse`` neither.
        k: results on this page.
        identity: what the query is, JSON-able (parts, weights, model): a cursor continues
            only the query with the same identity (and the same ``where``).
        vector: the unit query vector (``combine``'s).
        text: the words of a lexical or hybrid query.
        cursor: the previous page's ``next`` (None: the first page).
        exclude: keys that are no answer (the items of a "more like this" query).
        where: a filter that results must satisfy: the where language (:mod:`.where`), or its
            tree (with ``filters`` in it: :func:`.where.with_filters`).
        order: ``browse``'s order: ``newest`` (by capture time, else file time), ``-taken`` /
            ``taken`` (capture time newest / oldest first, items without one last in both),
            ``mtime`` (newest file first) or ``name``.

    Raises:
        InputError: a bad cursor, a mode without what it needs, lexical text that is too long
            or holds a NUL, or paging past ``MAX_K``.
    """
    from themis_clip.index.search import MAX_K

    condition = parse_where(where) if isinstance(where, Mapping) else where
    raw_where = where if isinstance(where, Mapping) or where is None else repr(where)
    query_id = fingerprint(
        {
            "mode": str(mode),
            "where": raw_where,
            "query": identity,
            **({"order": order} if mode == QueryMode.BROWSE and order != "newest" else {}),
        }
    )
    after = decode_cursor(cursor, query=query_id) if cursor is not None else None
    offset = after.offset if after else 0
    if offset + k > MAX_K:
        raise InputError(f"cursor: pages reach at most {MAX_K} results")
    if mode in (QueryMode.VECTOR, QueryMode.HYBRID) and vector is None:
        raise InputError(f"mode {mode}: give a query to embed (text, image, item or vector)")
    if mode in (QueryMode.LEXICAL, QueryMode.HYBRID):
        if not text or not text.strip():
            raise InputError(f"mode {mode}: give a text part to search the words of")
        if len(text) > MAX_QUERY_CHARS:
            raise InputError(f"text: at most {MAX_QUERY_CHARS} characters for lexical search")
        if "\x00" in text:  # no store can match it; SQLite's FTS5 would choke on it
            raise InputError("text: holds a NUL character (\\u0000), which lexical search refuses")

    def run(size: int) -> tuple[list[_Ranked], bool]:
        found = _ranked(index, mode, size, vector, text, condition, order)
        return [h for h in found if h.key not in exclude], len(found) < size

    needed = offset + k + 1  # one more than given: whether a next page exists
    stable = mode in (QueryMode.BROWSE, QueryMode.LEXICAL) or (
        mode == QueryMode.VECTOR and index.mode == "exact"
    )
    if stable:  # one search's prefix is every smaller search's result
        ranked, _ = run(window(needed + len(exclude), most=MAX_K))
    else:
        ranked = layered(run, needed, extra=len(exclude), most=MAX_K)
    start = _resume(ranked, after)
    chosen = ranked[start : start + k]
    more = len(ranked) > start + len(chosen) and bool(chosen)
    token = (
        encode_cursor(Cursor(query=query_id, offset=start + len(chosen), key=chosen[-1].key))
        if more
        else None
    )
    words = text if mode in (QueryMode.LEXICAL, QueryMode.HYBRID) else None
    return Page(hits=_records(index, chosen, words), next=token)


class _Keyed(Protocol):
    @property
    def key(self) -> str: ...


_K = TypeVar("_K", bound=_Keyed)


def layered(
    run: Callable[[int], tuple[list[_K], bool]], needed: int, *, extra: int, most: int
) -> list[_K]:
    """The canonical ranking of a search whose results depend on how many are asked for (a
    graph's beam widens with it; reciprocal rank fusion scores by the lists' lengths).

    Ranks ``[0, PAGE_WINDOW)`` are the search for ``PAGE_WINDOW`` results, ranks
    ``[PAGE_WINDOW, 2·PAGE_WINDOW)`` the search for twice as many less those already ranked,
    then ``[2, 4)``, ``[4, 8)``... windows: each boundary doubles. Any page is read off the
    same sequence, so pages concatenated equal one query with the summed ``k``, in order and
    without repeats, however the pages were cut; the cost of reaching rank ``n`` is about
    ``2n`` candidates. ``run(size)`` returns the search's results (excluded keys removed)
    and whether it found fewer than ``size`` (the end); ``extra`` results are asked for
    beyond each boundary for the excluded keys.
    """
    out: list[_K] = []
    seen: set[str] = set()
    boundary = PAGE_WINDOW
    while len(out) < needed:
        size = min(most, boundary + extra)
        found, ended = run(size)
        fresh = [h for h in found if h.key not in seen]
        last = ended or size >= most
        taken = fresh if last else fresh[: boundary - len(out)]
        out += taken
        seen.update(h.key for h in taken)
        if last:
            break
        boundary *= 2
    return out


def _resume(ranked: Sequence[_Keyed], after: Cursor | None) -> int:
    """Where the next page starts: right after the cursor's last item (at its offset when
    nothing changed; where that item is now when the index changed), else at the offset."""
    if after is None:
        return 0
    at = after.offset
    if 0 < at <= len(ranked) and ranked[at - 1].key == after.key:
        return at
    for i, hit in enumerate(ranked):
        if hit.key == after.key:
            return i + 1
    return min(at, len(ranked))


class _Ranked(NamedTuple):
    """A ranked item before its record is read: a page reads the records of its own only."""

    id: int
    key: str
    score: float
    words: bool = False  # found by the query's words: its OCR lines are matched against them


def _ranked(
    index: VectorIndex,
    mode: QueryMode,
    size: int,
    vector: npt.NDArray[np.float32] | None,
    text: str | None,
    where: Where | None = None,
    order: str = "newest",
) -> list[_Ranked]:
    if mode == QueryMode.BROWSE:
        index.check_keys(where)
        ids = _browse_order(index, index.store.timeline(where), order)[:size]
        keys = index.store.keys_by_id(ids)
        return [_Ranked(i, keys[i], 0.0) for i in ids if i in keys]
    by_vector: list[_Ranked] = []
    if mode != QueryMode.LEXICAL:
        assert vector is not None
        found = index.nearest(vector, size, where=where)
        by_vector = sorted((_Ranked(*f) for f in found), key=lambda h: (-h.score, h.key))
        if mode == QueryMode.VECTOR:
            return by_vector
    assert text is not None
    if not isinstance(index.store, Lexical):
        raise InputError(f"mode {mode}: the index at {index.location} has no word search")
    index.check_keys(where)
    ids = index.store.lexical(text, size, where)
    keys = index.store.keys_by_id(ids)
    by_words = [_Ranked(i, keys[i], 0.0, words=True) for i in ids if i in keys]
    known = {h.key: h for h in [*by_vector, *by_words]}
    fused = fuse([[h.key for h in by_words], [h.key for h in by_vector]])[:size]
    return [known[key]._replace(score=score) for key, score in fused]


def _records(index: VectorIndex, ranked: Sequence[_Ranked], text: str | None) -> list[Hit]:
    """The hits of ``ranked`` with their records (and, for those found by words, the OCR
    lines that ``text``'s words match); an item deleted or replaced since it was ranked is
    left out."""
    from themis_clip.index.search import Hit

    items = index.store.items_by_id([h.id for h in ranked])
    readings: dict[int, dict[str, Any]] = {}
    worded = [h.id for h in ranked if h.words]
    if text is not None and worded and isinstance(index.store, Lexical):
        readings = index.store.ocr_readings(worded)
    return [
        Hit(
            key=h.key,
            score=h.score,
            path=items[h.id].path,
            metadata=items[h.id].metadata,
            text_matches=_matched(text, readings.get(h.id)) if text is not None else (),
        )
        for h in ranked
        if h.id in items and items[h.id].key == h.key
    ]


def _matched(text: str, reading: Mapping[str, Any] | None) -> tuple[dict[str, Any], ...]:
    """The lines of an OCR ``reading`` that the words of ``text`` match, each with the
    picture's upright size as ``frame`` (the box's frame: a viewer scales it to what it shows)."""
    if not reading:
        return ()
    frame = [reading.get("width"), reading.get("height")]
    return tuple({**line, "frame": frame} for line in matched_lines(text, reading.get("lines", [])))
