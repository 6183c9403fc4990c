"""Search over an :class:`IndexStore`: exact numpy for small collections, HNSW above a threshold.

The store is the source of truth. The HNSW graph is a cache beside it (``<index>.usearch``),
tagged with the store's ``write_version``: when the store has changed since, the graph is
rebuilt (and saved when the index is writable). Read-only opens memory-map the graph.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.errors import IndexModelMismatchError
from themis_clip.index.ann import HNSWIndex
from themis_clip.index.store import IndexStore

__all__ = ["EXACT_THRESHOLD", "Hit", "ModelStamp", "VectorIndex", "top_k"]

log = logging.getLogger(__name__)

# Exact numpy search of 100k x 512 takes ~10 ms on 2 cores; HNSW only pays off beyond that.
EXACT_THRESHOLD = 200_000


@dataclass(frozen=True, kw_only=True)
class ModelStamp:
    """What an index records about the model that made its vectors."""

    model_id: str
    sha256: str
    dim: int


@dataclass(frozen=True, kw_only=True)
class Hit:
    key: str
    score: float
    path: str | None
    metadata: dict[str, Any] | None


def top_k(
    matrix: npt.NDArray[np.float32], query: npt.NDArray[np.float32], k: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Exact top ``k`` rows of ``matrix @ query``: ``(row indices, scores)``, best first."""
    scores = matrix @ query
    k = min(k, len(scores))
    if k <= 0:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    part = np.argpartition(-scores, k - 1)[:k]
    order = part[np.argsort(-scores[part], kind="stable")]
    return order.astype(np.int64), scores[order].astype(np.float32)


class VectorIndex:
    """Items with vectors, searchable by vector.

    Args:
        path: the SQLite file.
        readonly: open without writing (the HNSW graph is then memory-mapped).
        exact_threshold: collections at or below this size are searched exactly.
        expansion_search: HNSW search breadth (higher: better recall, slower).
        connectivity, expansion_add: HNSW graph degree and build breadth (when it is built).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        readonly: bool = False,
        exact_threshold: int = EXACT_THRESHOLD,
        expansion_search: int = 2048,
        connectivity: int = 64,
        expansion_add: int = 256,
    ) -> None:
        self.store = IndexStore(path, readonly=readonly)
        self.exact_threshold = exact_threshold
        self.expansion_search = expansion_search
        self._graph = {"connectivity": connectivity, "expansion_add": expansion_add}
        self._ann_path = Path(str(path) + ".usearch")
        self._cache_version = -1
        self._ids: npt.NDArray[np.int64] = np.empty(0, np.int64)
        self._matrix: npt.NDArray[np.float32] = np.empty((0, 0), np.float32)
        self._ann: HNSWIndex | None = None

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> VectorIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- model identity ------------------------------------------------------------------------

    @property
    def stamp(self) -> ModelStamp | None:
        meta = self.store.meta()
        if "model_id" not in meta:
            return None
        return ModelStamp(
            model_id=meta["model_id"], sha256=meta["model_sha256"], dim=int(meta["dim"])
        )

    def bind_model(self, stamp: ModelStamp) -> None:
        """Record ``stamp`` on an empty index, or check it against the recorded one."""
        current = self.stamp
        if current is None:
            self.store.set_meta(
                {"model_id": stamp.model_id, "model_sha256": stamp.sha256, "dim": stamp.dim}
            )
            return
        if current.sha256 != stamp.sha256 or current.dim != stamp.dim:
            raise IndexModelMismatchError(
                f"index {self.store.path} was built with model {current.model_id} "
                f"({current.dim}-d); "
                f"the current model is {stamp.model_id} ({stamp.dim}-d), whose vectors are not "
                f"comparable. Re-index with this model (`themis-clip index DIR --index NEW_PATH`, "
                f"or --rebuild to replace this index), or load model {current.model_id} again."
            )

    # -- search --------------------------------------------------------------------------------

    def search(
        self, query: npt.NDArray[np.float32], k: int = 10, filters: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """Top ``k`` items by cosine similarity to the unit vector ``query``."""
        stamp = self.stamp
        if stamp is None:
            return []
        query = np.asarray(query, dtype=np.float32).reshape(-1)
        if query.shape != (stamp.dim,):
            raise IndexModelMismatchError(
                f"query has {query.shape[0]} dimensions, the index {stamp.dim}"
            )
        self._refresh(stamp.dim)
        allowed = self.store.ids_matching(filters) if filters else None
        if self._ann is not None:
            fetch = k if allowed is None else min(len(self._ann), max(k * 20, len(allowed)))
            ids, scores = self._ann.search(query, fetch)
        else:
            rows, scores = top_k(self._matrix, query, len(self._ids) if allowed is not None else k)
            ids = self._ids[rows]
        if allowed is not None:
            keep = np.fromiter((i in allowed for i in ids), dtype=bool, count=len(ids))
            ids, scores = ids[keep], scores[keep]
        ids, scores = ids[:k], scores[:k]
        items = self.store.items_by_id([int(i) for i in ids])
        return [
            Hit(
                key=items[int(i)].key,
                score=float(s),
                path=items[int(i)].path,
                metadata=items[int(i)].metadata,
            )
            for i, s in zip(ids, scores, strict=True)
            if int(i) in items
        ]

    @property
    def mode(self) -> str:
        """``"exact"`` or ``"hnsw"``: how the next search runs."""
        return "hnsw" if self.store.count() > self.exact_threshold else "exact"

    def _refresh(self, dim: int) -> None:
        version = self.store.write_version
        if version == self._cache_version:
            return
        count = self.store.count()
        if count <= self.exact_threshold:
            self._ids, self._matrix = self.store.load_vectors(dim)
            self._ann = None
        else:
            self._ids, self._matrix = np.empty(0, np.int64), np.empty((0, dim), np.float32)
            self._ann = self._load_or_build_ann(dim, version)
        self._cache_version = self.store.write_version

    def _load_or_build_ann(self, dim: int, version: int) -> HNSWIndex:
        tag = self.store.meta().get("ann_version")
        if tag == str(version):
            ann = HNSWIndex.open(
                self._ann_path, view=self.store.readonly, expansion_search=self.expansion_search
            )
            if ann is not None:
                return ann
        log.info("building the HNSW graph for %s", self.store.path)
        ids, matrix = self.store.load_vectors(dim)
        ann = HNSWIndex.build(ids, matrix, expansion_search=self.expansion_search, **self._graph)
        if not self.store.readonly:
            ann.save(self._ann_path)
            # Saving bumps write_version; the tag records the version the graph matches.
            self.store.set_meta({"ann_version": version + 1})
        return ann
