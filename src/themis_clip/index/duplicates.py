"""Near-duplicate photos: groups of items whose vectors are nearly the same (re-encoded,
resized or lightly edited copies), as immich's duplicate detection finds them.

Each item asks a search graph for its nearest neighbours (not all pairs: 100k items would be
5·10⁹ of them): the index's own graph when it has one (SQLite), else one built for the run.
A candidate pair is kept when its exact cosine similarity (the stored float32 vectors) reaches
``threshold``; groups are the connected components of the kept pairs. A group's ``score`` is
the lowest similarity between any two of its items (computed exactly, so a chain a~b~c whose
ends are further apart says so). Small collections are compared exactly,
all pairs (it is then cheaper than building a graph).

The default threshold, 0.99 cosine similarity, is immich's (a maximum cosine *distance* of
0.01, ``machineLearning.duplicateDetection.maxDistance``): re-encoded and resized copies of a
photo land above it with CLIP-like models, while distinct shots of one scene (a burst, the
same view a minute apart) mostly fall below; lower it (0.97) to also catch crops and edits, at
the cost of grouping bursts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.index.ann import HNSWIndex
from themis_clip.index.search import VectorIndex
from themis_clip.index.settings import GraphDType

__all__ = ["DEFAULT_THRESHOLD", "DuplicateGroup", "find_duplicates"]

#: immich's maximum cosine distance 0.01, as a similarity.
DEFAULT_THRESHOLD = 0.99
#: At or below this many items every pair is compared (exact, and cheaper than a graph).
EXACT_BELOW = 4096
_BLOCK = 2048


@dataclass(frozen=True, kw_only=True)
class DuplicateGroup:
    """Items that are near-duplicates of each other, and the lowest similarity among them."""

    items: list[dict[str, Any]]
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"items": self.items, "score": self.score}


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
) -> list[DuplicateGroup]:
    """Groups of near-duplicate items, most similar first.

    Args:
        threshold: the cosine similarity at or above which two items are duplicates (-1 to 1).
        neighbours: graph neighbours asked per item (a photo with more copies than this is
            still grouped with them through the copies' own neighbours).
        threads: graph build and search threads (0: every core).
        exact_below: collections at or below this size compare every pair instead.

    Returns:
        Groups of two or more items; each item ``{"key", "path", "metadata"}``.
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
        members = vectors[rows]
        score = min(
            float((members[i : i + _BLOCK] @ members.T).min()) for i in range(0, len(rows), _BLOCK)
        )
        items = index.store.items_by_id([int(ids[r]) for r in rows])
        entries = sorted(
            ({"key": it.key, "path": it.path, "metadata": it.metadata} for it in items.values()),
            key=lambda e: str(e["key"]),
        )
        groups.append(DuplicateGroup(items=entries, score=min(1.0, score)))
    groups.sort(key=lambda g: (-g.score, str(g.items[0]["key"])))
    return groups
