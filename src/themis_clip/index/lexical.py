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

The text read in a picture (OCR) is matched by **substring**: every query word must occur in
it (``bucks`` finds ``STARBUCKS``). Query words are its runs of letters and digits, as the
text is split (``"hotel"`` and ``(bucks,`` search ``hotel`` and ``bucks``), and query and text
are both :func:`fold`-ed (NFKC and case-folded, in Python on both stores: SQLite's ``lower()``
folds ASCII only), so full-width ``ＳＴＡＲＢＵＣＫＳ`` finds ``STARBUCKS``
and ``ça`` finds ``ÇA``. Both stores find candidates through an index of trigrams
(SQLite: FTS5's ``trigram`` tokenizer; PostgreSQL: a GIN-indexed array of
:func:`trigrams`, since ``pg_trgm`` is a contrib module that many servers, the embedded test
builds among them, do not ship). A query word shorter than three characters has no trigram:
it is checked on the OCR rows alone (a scan of the items that have text, not of the index).
**Tolerant** matching absorbs OCR's misreadings: when fewer exact matches than asked for are
found, items whose text holds, for each query word of at least :data:`TOLERANT_MIN_CHARS`
characters, a word of :func:`similarity` at least :data:`TOLERANCE` (pg_trgm's measure) come
after them. The word ranking and the OCR ranking are merged by :func:`interleave`, so a
shorter search's results are always the start of a longer one's (stable pages).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "MAX_QUERY_CHARS",
    "RRF_K",
    "TOLERANCE",
    "TOLERANT_MIN_CHARS",
    "fold",
    "fts5_query",
    "fuse",
    "interleave",
    "matched_lines",
    "ocr_score",
    "ocr_words",
    "similarity",
    "trigrams",
]

#: The constant of reciprocal rank fusion (Cormack et al. 2009; also Elastic's and OpenSearch's
#: default): an item ranked r in a list scores 1 / (RRF_K + r).
RRF_K = 60
#: Longer lexical queries are refused (a search box, not a document).
MAX_QUERY_CHARS = 1000

#: Word similarity from which an OCR word counts as a misreading of a query word.
TOLERANCE = 0.5
#: Shorter query words match by substring only (a trigram or two tell nothing).
TOLERANT_MIN_CHARS = 4

_WORD = re.compile(r"\S+")
_ALNUM = re.compile(r"[^\W_]+")
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


def fold(text: str) -> str:
    """``text`` NFKC-normalised and case-folded: how OCR text is stored and searched, so that
    full-width, ligature and accented capitals match their plain lower-case forms."""
    return unicodedata.normalize("NFKC", text).casefold()


def ocr_words(text: str) -> list[str]:
    """The words of a query as OCR text is searched for them: the runs of letters and digits
    of the :func:`fold`-ed query (punctuation around or inside a word splits it), duplicates
    dropped, in order."""
    return list(dict.fromkeys(_ALNUM.findall(fold(text))))


def trigrams(word: str, *, padded: bool = True) -> set[str]:
    """The character trigrams of ``word`` lower-cased (``padded``: as pg_trgm pads a word, two
    spaces before and one after, so its start and end count)."""
    w = word.lower()
    if padded:
        w = f"  {w} "
    return {w[i : i + 3] for i in range(len(w) - 2)}


def similarity(word: str, text: str) -> float:
    """How close ``word`` comes to a word of ``text``: the best Jaccard similarity of padded
    trigram sets (pg_trgm's ``similarity``) over the alphanumeric words of ``text``."""
    mine = trigrams(word)
    best = 0.0
    for other in _ALNUM.findall(text):
        theirs = trigrams(other)
        best = max(best, len(mine & theirs) / len(mine | theirs))
    return best


def _word_matches(word: str, text: str) -> float:
    """1 when ``word`` (an :func:`ocr_words` word) is a substring of ``text`` folded, else its
    :func:`similarity` when tolerance applies and reaches :data:`TOLERANCE`, else 0."""
    folded = fold(text)
    if word in folded:
        return 1.0
    if len(word) < TOLERANT_MIN_CHARS:
        return 0.0
    score = similarity(word, folded)
    return score if score >= TOLERANCE else 0.0


def ocr_score(words: Sequence[str], text: str) -> float:
    """How well OCR ``text`` matches every query word (0: it does not; 1: every word is a
    substring of it; between: some only tolerantly, the weakest word's similarity)."""
    if not words:
        return 0.0
    return min(_word_matches(w, text) for w in words)


def matched_lines(text: str, lines: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The OCR ``lines`` (``{"text", "box", "confidence"}``) holding a word of the query
    ``text``, by substring or tolerantly (what a result shows as matched, and where)."""
    words = ocr_words(text)
    return [
        line for line in lines if any(_word_matches(w, str(line.get("text", ""))) for w in words)
    ]


def interleave(rankings: Sequence[Sequence[T]]) -> list[T]:
    """Round-robin merge of ranked lists, repeats dropped: the first of each, then the
    second of each... Unlike :func:`fuse` it is stable under truncation: merging each list's
    first ``n`` gives the first ``n`` of merging them whole."""
    out: list[T] = []
    seen: set[T] = set()
    for rank in range(max((len(r) for r in rankings), default=0)):
        for ranking in rankings:
            if rank < len(ranking) and ranking[rank] not in seen:
                seen.add(ranking[rank])
                out.append(ranking[rank])
    return out
