"""Search over an :class:`IndexStore`: exact numpy for small collections, HNSW above a threshold.

The store is the source of truth. The HNSW graph is a cache beside it (``<index>.usearch``),
tagged with the store's ``write_version``: when the store has changed since, the graph is
rebuilt (and saved when the index is writable). Read-only opens memory-map the graph.

Building a graph of a few hundred thousand vectors takes minutes, so no search waits for one
unless the caller wants that (the default for a writable index, and ``prepare_graph``, which
``themis-clip index`` runs after indexing):

* ``background_build=True`` (the HTTP server): searches stay exact (complete, correct, slower)
  while a daemon thread builds the graph on half the cores; the next search after it finishes
  switches to it (and saves it when the index is writable). Writes during the build make it
  stale; it is then built again.
* read-only without a current saved graph (one-shot CLI search): exact, since one exact query
  is far cheaper than a graph that could not be kept.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.errors import IndexModelMismatchError
from themis_clip.index.ann import HNSWIndex
from themis_clip.index.store import IndexStore
from themis_clip.vocabulary import ModelIdentity

__all__ = ["EXACT_THRESHOLD", "Hit", "ModelStamp", "VectorIndex", "top_k"]

log = logging.getLogger(__name__)

# Exact numpy search of 100k x 512 takes ~10 ms on 2 cores; HNSW only pays off beyond that.
EXACT_THRESHOLD = 200_000


def ModelStamp(*, model_id: str, sha256: str, dim: int) -> ModelIdentity:  # noqa: N802
    """The index's former name for the model identity (kept for callers of earlier versions)."""
    return ModelIdentity.from_model_id(model_id, sha256=sha256, dim=dim)


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


#: The saved HNSW graph lives beside the database as ``<index>`` + this suffix.
GRAPH_SUFFIX = ".usearch"


class VectorIndex:
    """Items with vectors, searchable by vector.

    Args:
        path: the SQLite file.
        readonly: open without writing (the HNSW graph is then memory-mapped).
        exact_threshold: collections at or below this size are searched exactly.
        expansion_search: HNSW search breadth (higher: better recall, slower).
        connectivity, expansion_add: HNSW graph degree and build breadth (when it is built).
        background_build: build a missing or stale graph in a background thread while searches
            run exactly (see the module docstring); False: the next search builds it.
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
        background_build: bool = False,
    ) -> None:
        self.store = IndexStore(path, readonly=readonly)
        self.exact_threshold = exact_threshold
        self.expansion_search = expansion_search
        self._graph = {"connectivity": connectivity, "expansion_add": expansion_add}
        self._ann_path = Path(str(path) + GRAPH_SUFFIX)
        self._cache_version = -1
        self._ids: npt.NDArray[np.int64] = np.empty(0, np.int64)
        self._matrix: npt.NDArray[np.float32] = np.empty((0, 0), np.float32)
        self._ann: HNSWIndex | None = None
        self._background = background_build
        self._building: tuple[int, Future[HNSWIndex]] | None = None

    def close(self) -> None:
        self.store.close()

    @staticmethod
    def files(path: str | Path) -> list[Path]:
        """Every file an index at ``path`` may consist of: the database, SQLite's write-ahead
        log and shared-memory files, and the saved HNSW graph."""
        return [Path(str(path) + suffix) for suffix in ("", "-wal", "-shm", GRAPH_SUFFIX)]

    @staticmethod
    def remove(path: str | Path) -> None:
        """Delete an index at ``path`` with all its side files (absent ones are fine)."""
        for file in VectorIndex.files(path):
            file.unlink(missing_ok=True)

    def __enter__(self) -> VectorIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- model identity ------------------------------------------------------------------------

    @property
    def stamp(self) -> ModelIdentity | None:
        meta = self.store.meta()
        if "model_id" not in meta:
            return None
        return ModelIdentity.from_model_id(
            meta["model_id"], sha256=meta["model_sha256"], dim=int(meta["dim"])
        )

    def bind_model(self, stamp: ModelIdentity) -> None:
        """Record ``stamp`` on an empty index, or check it against the recorded one."""
        current = self.stamp
        if current is None:
            self.store.set_meta(
                {"model_id": stamp.model_id, "model_sha256": stamp.sha256, "dim": stamp.dim}
            )
            return
        if current.sha256 != stamp.sha256 or current.dim != stamp.dim:
            raise IndexModelMismatchError(
                f"this index was built with model {current.model_id} "
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

    def search_like(
        self, key: str, k: int = 10, filters: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """ "More like this": the top ``k`` items by similarity to item ``key``'s stored vector
        (the item itself first). Raises KeyError when there is no such item."""
        vector = self.store.vector(key)
        if vector is None:
            raise KeyError(key)
        norm = float(np.linalg.norm(vector))
        return self.search(vector / norm if norm > 0 else vector, k, filters)

    @property
    def mode(self) -> str:
        """``"exact"`` or ``"hnsw"``: how the next search runs."""
        if self.store.count() <= self.exact_threshold:
            return "exact"
        if self._graph_is_current() or self._saved_tag_is_current():
            return "hnsw"
        if not (self._background or self.store.readonly):
            return "hnsw"  # the next search builds the graph
        return "exact"

    @property
    def graph_building(self) -> bool:
        """Whether a background graph build is running."""
        return self._building is not None and not self._building[1].done()

    def prepare_graph(self) -> bool:
        """Build and save the HNSW graph now if the collection needs one and it is stale.

        Returns:
            True if a graph was built.
        """
        stamp = self.stamp
        if stamp is None or self.store.count() <= self.exact_threshold:
            return False
        if self._graph_is_current() or self._saved_tag_is_current():
            return False
        ids, matrix = self.store.load_vectors(stamp.dim)
        self._install(self._build(ids, matrix, threads=0), self.store.write_version)
        return True

    def _graph_is_current(self) -> bool:
        return self._ann is not None and self._cache_version == self.store.write_version

    def _saved_tag_is_current(self) -> bool:
        return self.store.meta().get("ann_version") == str(self.store.write_version)

    def _refresh(self, dim: int) -> None:
        version = self.store.write_version
        if self._building is not None and self._building[1].done():
            built, future = self._building
            self._building = None
            try:
                ann = future.result()
            except Exception as exc:  # a failed build leaves exact search serving
                log.warning("building the HNSW graph for %s failed: %s", self.store.path, exc)
            else:
                if built == version:
                    self._install(ann, version)
                    return
                self._cache_version = -1  # stale: build again for the current version
        if version == self._cache_version:
            return
        count = self.store.count()
        saved = self._open_saved(version) if count > self.exact_threshold else None
        if count <= self.exact_threshold:
            self._exact(dim)
        elif saved is not None:
            self._use(saved)
        elif self._background:
            self._exact(dim)
            if self._building is None:
                self._start_build(version)
        elif self.store.readonly:
            log.info(
                "%s has no current HNSW graph; searching exactly (`themis-clip index` builds it)",
                self.store.path,
            )
            self._exact(dim)
        else:
            ids, matrix = self.store.load_vectors(dim)
            self._install(self._build(ids, matrix, threads=0), version)
            return
        self._cache_version = self.store.write_version

    def _exact(self, dim: int) -> None:
        self._ids, self._matrix = self.store.load_vectors(dim)
        self._ann = None

    def _use(self, ann: HNSWIndex) -> None:
        self._ann = ann  # the exact-search matrix is no longer needed: free it
        self._ids, self._matrix = np.empty(0, np.int64), np.empty((0, 0), np.float32)

    def _open_saved(self, version: int) -> HNSWIndex | None:
        if self.store.meta().get("ann_version") != str(version):
            return None
        return HNSWIndex.open(
            self._ann_path, view=self.store.readonly, expansion_search=self.expansion_search
        )

    def _build(
        self, ids: npt.NDArray[np.int64], matrix: npt.NDArray[np.float32], *, threads: int
    ) -> HNSWIndex:
        log.info("building the HNSW graph for %s (%d vectors)", self.store.path, len(ids))
        return HNSWIndex.build(
            ids, matrix, expansion_search=self.expansion_search, threads=threads, **self._graph
        )

    def _start_build(self, version: int) -> None:
        """Build on a daemon thread from a snapshot of the vectors (no SQLite use off-thread)."""
        ids, matrix = self._ids, self._matrix
        future: Future[HNSWIndex] = Future()
        threads = max(1, (os.cpu_count() or 2) // 2)  # leave cores to the embedding sessions

        def work() -> None:
            try:
                future.set_result(self._build(ids, matrix, threads=threads))
            except BaseException as exc:
                future.set_exception(exc)

        self._building = (version, future)
        threading.Thread(target=work, name="themis-hnsw-build", daemon=True).start()

    def _install(self, ann: HNSWIndex, version: int) -> None:
        """Serve ``ann`` (built for ``version``) and save it when the index is writable."""
        self._use(ann)
        if not self.store.readonly:
            ann.save(self._ann_path)
            # Saving bumps write_version; the tag records the version the graph matches.
            self.store.set_meta({"ann_version": version + 1})
        self._cache_version = self.store.write_version
