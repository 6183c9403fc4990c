"""Lexical search's pure parts: the query a store's full-text index is asked, and reciprocal
rank fusion of ranked lists (hybrid search).

What is searched: an item's key, its path and its metadata's string values. SQLite keeps them
in an FTS5 table whose ``unicode61`` tokenizer counts ``_`` as part of a word (so
``IMG_4711.jpg`` holds the token ``img_4711`` and the query ``IMG_4711`` finds it; ``/`` and
``.`` separate words); PostgreSQL keeps a generated ``tsvector`` (``simple`` configuration,
``/``, ``.`` and ``-`` read as spaces) under a GIN index and reads the query the same way,
as plain words (``plainto_tsquery``). Both require every query word (AND). The SQL lives
with each store's schema (:mod:`.stores.sqlite.schema`, :mod:`.stores.postgres.schema`); user text
only ever travels as a bound parameter.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import TypeVar

__all__ = ["MAX_QUERY_CHARS", "RRF_K", "fts5_query", "fuse"]

#: The constant of reciprocal rank fusion (Cormack et al. 2009; also Elastic's and OpenSearch's
#: default): an item ranked r in a list scores 1 / (RRF_K + r).
RRF_K = 60
#: Longer lexical queries are refused (a search box, not a document).
MAX_QUERY_CHARS = 1000

_WORD = re.compile(r"\S+")
_HAS_TOKEN = re.compile(r"\w")

T = TypeVar("T", bound=Hashable)


def fts5_query(text: str) -> str | None:
    """``text`` as an FTS5 query: each whitespace-separated word a quoted phrase (so no FTS5
    syntax from the user is ever interpreted), all required. None: no word to search for."""
    words = [w for w in _WORD.findall(text) if _HAS_TOKEN.search(w)]
    if not words:
        return None
    return " AND ".join('"' + w.replace('"', '""') + '"' for w in words)


def fuse(rankings: Sequence[Sequence[T]], *, k: int = RRF_K) -> list[tuple[T, float]]:
    """Reciprocal rank fusion: each item scores the sum of ``1 / (k + rank)`` (rank from 1)
    over the lists it is in. Returns ``(item, score)``, best first; ties keep first-seen
    order (the first list's)."""
    scores: dict[T, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, 1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    order = sorted(enumerate(scores.items()), key=lambda p: (-p[1][1], p[0]))
    return [pair for _, pair in order]
