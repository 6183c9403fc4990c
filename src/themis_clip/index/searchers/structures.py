"""Answering queries over the structures a :class:`~.local.LocalSearcher` holds at one moment:
exact numpy over the matrix, or the HNSW graph with its candidates re-scored exactly.

The searcher keeps those structures current and hands a :class:`Structures` snapshot to these
functions under its read lock; nothing here changes them. A compact graph's (i8, f16)
candidates are re-scored from float32 vectors: the vectors file beside the graph
(:mod:`..vectors`, memory-mapped), or the store's rows for any id it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from themis_clip.config import SearchConfig
from themis_clip.index.ann import HNSWIndex
from themis_clip.index.kernels import rescore, top_k, top_k_many
from themis_clip.index.settings import GraphDType
from themis_clip.index.stores.base import Store
from themis_clip.index.vectors import VectorTable

__all__ = ["SELECTIVE_FILTER", "Structures"]

#: Filters matching at most this many items are answered exactly over just those items.
SELECTIVE_FILTER = 20_000

Result = tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]


@dataclass(frozen=True, kw_only=True)
class Structures:
    """What searches read: the graph (None: exact search over ``ids``/``matrix``) and the
    float32 vectors its candidates are re-scored with (None: the store's rows)."""

    store: Store
    settings: SearchConfig
    ann: HNSWIndex | None
    table: VectorTable | None
    ids: npt.NDArray[np.int64]
    matrix: npt.NDArray[np.float32]

    def vectors_of(self, ids: npt.NDArray[np.int64], dim: int) -> npt.NDArray[np.float32]:
        """The float32 vectors of ``ids``: from the vectors table, the store for any it lacks."""
        table = self.table
        if table is None:
            return self.store.vectors_by_id(ids.tolist(), dim)
        vectors, found = table.lookup(ids)
        if not found.all():  # a write not caught up yet: the store has it
            missing = np.flatnonzero(~found)
            vectors[missing] = self.store.vectors_by_id(ids[missing].tolist(), dim)
        return vectors

    def search(
        self, query: npt.NDArray[np.float32], k: int, allowed: set[int] | None, dim: int
    ) -> Result:
        """The top ``k`` ``(ids, scores)`` among ``allowed`` (None: every item)."""
        graph_or_empty = self.ann is not None or not len(self.ids)
        if allowed is not None and graph_or_empty and len(allowed) <= SELECTIVE_FILTER:
            ids = np.fromiter(allowed, dtype=np.int64, count=len(allowed))  # exact: complete
            return rescore(ids, self.vectors_of(ids, dim), query, k)
        if self.ann is None:
            if allowed is None:
                rows, scores = top_k(self.matrix, query, k)
                return self.ids[rows], scores
            mask = np.isin(self.ids, np.fromiter(allowed, dtype=np.int64, count=len(allowed)))
            rows, scores = top_k(self.matrix[mask], query, k)
            return self.ids[mask][rows], scores
        ann = self.ann
        want = k
        if allowed is not None:  # a broad filter: widen the candidate list by its rarity
            want = int(k * max(1.0, 2 * len(ann) / max(1, len(allowed))))
        # Matches found only at the edge of the beam are its least accurate part: ask for as
        # many matching candidates as an unfiltered search re-scores, at least twice k.
        enough = max(2 * k, self.settings.fetch(k, ann.dtype))
        while True:
            fetch = min(len(ann), self.settings.fetch(want, ann.dtype))
            ids, scores = ann.search(query, fetch)
            if allowed is None:
                break
            keep = np.fromiter((int(i) in allowed for i in ids), dtype=bool, count=len(ids))
            ids, scores = ids[keep], scores[keep]
            if len(ids) >= min(enough, len(allowed)) or fetch >= len(ann):
                break
            want *= 4  # the matches lie further out: widen until enough are found (or all seen)
        if ann.dtype != GraphDType.F32:
            return rescore(ids, self.vectors_of(ids, dim), query, k)
        return ids[:k], scores[:k]

    def search_many(
        self, queries: npt.NDArray[np.float32], k: int, allowed: set[int] | None, dim: int
    ) -> list[Result]:
        """:meth:`search` for each row of ``queries``, with the same results. Without a filter
        the graph searches them as one batch on every core (exact search: one matrix product
        per block of queries); with one, each query is searched in turn."""
        ann = self.ann
        if allowed is not None:
            return [self.search(q, k, allowed, dim) for q in queries]
        if ann is None:
            rows, scores = top_k_many(self.matrix, queries, k)
            return [(self.ids[r], s) for r, s in zip(rows, scores, strict=True)]
        fetch = min(len(ann), self.settings.fetch(k, ann.dtype))
        keys, approximate, counts = ann.search_batch(queries, fetch)
        if ann.dtype == GraphDType.F32:
            return [
                (keys[i, : min(n, k)], approximate[i, : min(n, k)]) for i, n in enumerate(counts)
            ]
        vectors = self.vectors_of(keys[keys >= 0], dim)  # each row's matches come first
        out, start = [], 0
        for query, row, n in zip(queries, keys, counts, strict=True):
            out.append(rescore(row[:n], vectors[start : start + n], query, k))
            start += n
        return out
