"""Near-duplicate photos: groups of items whose vectors are nearly the same (re-encoded,
resized or lightly edited copies), as immich's duplicate detection finds them.

Each item asks a search graph for its nearest neighbours (not all pairs: 100k items would be
5·10⁹ of them): the index's own graph when it has one (SQLite), else one built for the run.
A candidate pair is kept when its exact cosine similarity (the stored float32 vectors) reaches
``threshold``; groups are the connected components of the kept pairs. A group's ``score`` is
the lowest similarity between any two of its items (computed exactly, so a chain a~b~c whose
ends are further apart says so). Small collections are compared exactly,
all pairs (it is then cheaper than building a graph).

Each group is labelled by its weakest bond, so that one threshold no longer mixes identical
files, re-encodes and burst shots: ``identical`` (the same bytes), ``same-pixels`` (decoded
pixels equal: a lossless re-save, stripped metadata), ``resized`` (the same picture at another
size or quality: the same capture time, or none recorded), ``similar`` (distinct shots taken
within ``window_s`` of each other: a burst). Two items taken further apart than the window are
no duplicates, however alike. Each group names a suggested keeper and why (the most pixels,
then a RAW beside it, then the most complete EXIF, then the oldest file); nothing is deleted.

The default threshold, 0.99 cosine similarity, is immich's (a maximum cosine *distance* of
0.01, ``machineLearning.duplicateDetection.maxDistance``): re-encoded and resized copies of a
photo land above it with CLIP-like models, while distinct shots of one scene (a burst, the
same view a minute apart) mostly fall below; lower it (0.97) to also catch crops and edits, at
the cost of grouping bursts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.index.ann import HNSWIndex
from themis_clip.index.search import VectorIndex
from themis_clip.index.settings import GraphDType
from themis_clip.index.stores.rows import StoredItem

__all__ = [
    "DEFAULT_THRESHOLD",
    "DEFAULT_WINDOW_S",
    "DuplicateGroup",
    "Keeper",
    "Tier",
    "find_duplicates",
]

#: immich's maximum cosine distance 0.01, as a similarity.
DEFAULT_THRESHOLD = 0.99
#: Shots taken this close together may be a burst (``similar``); further apart they are not
#: duplicates.
DEFAULT_WINDOW_S = 10.0

#: Whether two files decode to the same pixels (given by a caller that can decode: the index
#: itself never opens images).
SamePixels = Callable[[str, str], bool]


class Tier(StrEnum):
    """How alike a group's items are, from the strongest bond to the weakest."""

    IDENTICAL = "identical"
    SAME_PIXELS = "same-pixels"
    RESIZED = "resized"
    SIMILAR = "similar"


@dataclass(frozen=True, kw_only=True)
class Keeper:
    """The item a group suggests keeping, and why."""

    key: str
    reason: str


#: At or below this many items every pair is compared (exact, and cheaper than a graph).
EXACT_BELOW = 4096
_BLOCK = 2048


@dataclass(frozen=True, kw_only=True)
class DuplicateGroup:
    """Items that are near-duplicates of each other, the lowest similarity among them, how
    alike they are and which one to keep."""

    items: list[dict[str, Any]]
    score: float
    tier: Tier = Tier.RESIZED
    keeper: Keeper | None = None

    def to_dict(self) -> dict[str, Any]:
        keeper = (
            None if self.keeper is None else {"key": self.keeper.key, "reason": self.keeper.reason}
        )
        return {"items": self.items, "score": self.score, "tier": str(self.tier), "keeper": keeper}

    @property
    def others(self) -> list[dict[str, Any]]:
        """The items other than the keeper (what a user's own script may act on)."""
        keep = self.keeper.key if self.keeper is not None else None
        return [item for item in self.items if item["key"] != keep]


#: Similarities this close below the threshold count: float32 products of unit vectors round
#: (two identical 512-d vectors score 0.9999998), so threshold 1 still means "identical".
ROUNDING = 1e-5


def _pairs_exact(
    vectors: npt.NDArray[np.float32], threshold: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    rows_a, rows_b = [], []
    for start in range(0, len(vectors), _BLOCK):
        sims = vectors[start : start + _BLOCK] @ vectors.T
        a, b = np.nonzero(sims >= threshold)
        a += start
        keep = a < b
        rows_a.append(a[keep])
        rows_b.append(b[keep])
    return np.concatenate(rows_a), np.concatenate(rows_b)


def _graph(
    index: VectorIndex, ids: npt.NDArray[np.int64], vectors: npt.NDArray[np.float32], threads: int
) -> HNSWIndex:
    """The index's own search graph when it has one that holds every item (SQLite's, saved
    by ``themis-clip index``), else a temporary one (PostgreSQL's lives in the server)."""
    current = getattr(index.searcher, "current_graph", None)
    graph = current(vectors.shape[1]) if current is not None else None
    if isinstance(graph, HNSWIndex) and len(graph) == len(ids):
        return graph
    # Near-duplicates sit very close: a light graph finds them (build time is the cost here).
    graph = HNSWIndex.build(
        ids, vectors, connectivity=12, expansion_add=40, dtype=GraphDType.I8, threads=threads
    )
    graph.expansion_search = 128  # a wider beam costs less than a denser graph here
    return graph


def _pairs_graph(
    graph: HNSWIndex,
    ids: npt.NDArray[np.int64],
    vectors: npt.NDArray[np.float32],
    threshold: float,
    neighbours: int,
    threads: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    found = graph.search_many(vectors, neighbours + 1, threads=threads)  # itself among them
    rows = np.searchsorted(ids, found)  # ids are sorted (the stores load them in id order)
    rows[(found < 0) | (rows >= len(ids))] = -1
    rows_a, rows_b = [], []
    own = np.arange(len(ids))
    for column in range(rows.shape[1]):
        other = rows[:, column]
        valid = (other >= 0) & (other != own)
        a, b = own[valid], other[valid]
        sims = np.einsum("ij,ij->i", vectors[a], vectors[b])  # exact, float32
        keep = sims >= threshold
        rows_a.append(np.minimum(a[keep], b[keep]))
        rows_b.append(np.maximum(a[keep], b[keep]))
    return np.concatenate(rows_a), np.concatenate(rows_b)


def _components(n: int, a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> list[list[int]]:
    """Connected components (of two or more rows) of the graph with edges ``a[i]-b[i]``."""
    parent = np.arange(n)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        rx, ry = root(x), root(y)
        if rx != ry:
            parent[max(rx, ry)] = min(rx, ry)
    groups: dict[int, list[int]] = {}
    for x in sorted(set(a.tolist()) | set(b.tolist())):
        groups.setdefault(root(x), []).append(x)
    return [g for g in groups.values() if len(g) > 1]


def find_duplicates(
    index: VectorIndex,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    neighbours: int = 8,
    threads: int = 0,
    exact_below: int = EXACT_BELOW,
    window_s: float = DEFAULT_WINDOW_S,
    same_pixels: SamePixels | None = None,
) -> list[DuplicateGroup]:
    """Groups of near-duplicate items, most similar first.

    Args:
        threshold: the cosine similarity at or above which two items are duplicates (-1 to 1).
        neighbours: graph neighbours asked per item (a photo with more copies than this is
            still grouped with them through the copies' own neighbours).
        threads: graph build and search threads (0: every core).
        exact_below: collections at or below this size compare every pair instead.
        window_s: the most seconds between two capture times that may still be one burst.
        same_pixels: tells whether two files decode to equal pixels (the ``same-pixels``
            tier); without it such groups are ``resized``.

    Returns:
        Groups of two or more items; each item ``{"key", "path", "metadata", "size"}``.
    """
    if not -1.0 <= threshold <= 1.0:
        raise ValueError(f"threshold {threshold}: expected a cosine similarity from -1 to 1")
    stamp = index.stamp
    if stamp is None:
        return []
    ids, vectors = index.store.load_vectors(stamp.dim)
    if len(ids) < 2:
        return []
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    cut = threshold - ROUNDING  # identical files must meet threshold 1 in float32
    if len(ids) <= exact_below:
        a, b = _pairs_exact(vectors, cut)
    else:
        graph = _graph(index, ids, vectors, threads)
        a, b = _pairs_graph(graph, ids, vectors, cut, neighbours, threads)
    groups = []
    for rows in _components(len(ids), a, b):
        items = index.store.items_by_id([int(ids[r]) for r in rows])
        by_row = {r: items[int(ids[r])] for r in rows if int(ids[r]) in items}
        for part in _by_time(list(by_row), by_row, a, b, window_s):
            members = vectors[part]
            score = min(
                float((members[i : i + _BLOCK] @ members.T).min())
                for i in range(0, len(part), _BLOCK)
            )
            stored = [by_row[r] for r in part]
            entries = sorted(
                (
                    {"key": it.key, "path": it.path, "metadata": it.metadata, "size": it.size}
                    for it in stored
                ),
                key=lambda e: str(e["key"]),
            )
            groups.append(
                DuplicateGroup(
                    items=entries,
                    score=min(1.0, score),
                    tier=_tier(stored, same_pixels),
                    keeper=_keeper(stored),
                )
            )
    groups.sort(key=lambda g: (-g.score, str(g.items[0]["key"])))
    return groups


def _taken(item: StoredItem) -> datetime | None:
    value = (item.metadata or {}).get("taken")
    try:
        stamp = datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None
    return None if stamp is None else stamp.replace(tzinfo=None)


def _by_time(
    rows: list[int],
    items: dict[int, StoredItem],
    a: npt.NDArray[np.int64],
    b: npt.NDArray[np.int64],
    window_s: float,
) -> list[list[int]]:
    """The group split where its kept pairs were taken more than ``window_s`` apart (two
    photos of one view an hour apart are no duplicates, however alike)."""
    inside = set(rows)
    keep_a, keep_b = [], []
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        if x not in inside or y not in inside:
            continue
        tx, ty = _taken(items[x]), _taken(items[y])
        if tx is None or ty is None or abs((tx - ty).total_seconds()) <= window_s:
            keep_a.append(x)
            keep_b.append(y)
    local = {r: i for i, r in enumerate(rows)}

    def parts(edges: list[tuple[int, int]]) -> list[list[int]]:
        found = _components(
            len(rows),
            np.array([local[x] for x, _ in edges], dtype=np.int64),
            np.array([local[y] for _, y in edges], dtype=np.int64),
        )
        return [[rows[i] for i in part] for part in found]

    edges = list(zip(keep_a, keep_b, strict=True))
    out = []
    for part in parts(edges):
        stamps = [t for t in (_taken(items[r]) for r in part) if t is not None]
        if stamps and (max(stamps) - min(stamps)).total_seconds() > window_s:
            # an undated copy chained shots taken far apart: it joins neither
            inside_part = set(part)
            dated = [
                (x, y)
                for x, y in edges
                if x in inside_part
                and y in inside_part
                and (_taken(items[x]) is None) == (_taken(items[y]) is None)
            ]
            out += [p for p in parts(dated) if set(p) <= inside_part]
        else:
            out.append(part)
    return out


def _tier(items: list[StoredItem], same_pixels: SamePixels | None) -> Tier:
    digests = {it.sha256 for it in items}
    if len(digests) == 1 and None not in digests:
        return Tier.IDENTICAL
    first = items[0]
    sizes = {((it.metadata or {}).get("width"), (it.metadata or {}).get("height")) for it in items}
    if same_pixels is not None and len(sizes) == 1 and all(it.path for it in items):
        try:
            if all(same_pixels(str(first.path), str(it.path)) for it in items[1:]):
                return Tier.SAME_PIXELS
        except OSError:
            pass
    stamps = {_taken(it) for it in items} - {None}
    return Tier.SIMILAR if len(stamps) > 1 else Tier.RESIZED


def _size(item: StoredItem) -> str:
    meta = item.metadata or {}
    return f"{meta.get('width')}x{meta.get('height')}"


def _keeper(items: list[StoredItem]) -> Keeper:
    """The most pixels, then a RAW beside it, then the most complete EXIF, then the oldest
    file; the reason names the first rule that told the items apart."""

    def pixels(it: StoredItem) -> int:
        meta = it.metadata or {}
        width, height = meta.get("width"), meta.get("height")
        return int(width) * int(height) if isinstance(width, int) and isinstance(height, int) else 0

    def has_raw(it: StoredItem) -> int:
        return 1 if (it.metadata or {}).get("raw") else 0

    def exif(it: StoredItem) -> int:
        return sum(1 for k in ("taken", "camera", "gps") if (it.metadata or {}).get(k))

    def age(it: StoredItem) -> int:
        return -(it.mtime_ns or 0)

    rules: tuple[tuple[Callable[[StoredItem], int], Callable[[StoredItem], str]], ...] = (
        (pixels, lambda it: f"the most pixels ({_size(it)})"),
        (has_raw, lambda it: f"its RAW is beside it ({(it.metadata or {}).get('raw')})"),
        (exif, lambda it: "the most complete EXIF (taken, camera, place)"),
        (age, lambda it: "the oldest file"),
    )
    ranked = sorted(items, key=lambda it: (*(-rule(it) for rule, _ in rules), it.key))
    best = ranked[0]
    for rule, reason in rules:
        if any(rule(it) != rule(best) for it in ranked[1:]):
            return Keeper(key=best.key, reason=reason(best))
    return Keeper(key=best.key, reason="all alike: the first by name")
