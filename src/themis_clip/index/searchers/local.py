"""Searching a store's vectors here: exact numpy, or an HNSW graph when one is measured to pay
off (:mod:`..tuning`). For the SQLite store; a store is searched here unless it searches itself.

The store is the source of truth; the HNSW graph is a cache beside it (``<index>.usearch``)
tagged with the store's ``write_version``. Writes do not throw the graph (or the exact matrix)
away: the store records which rows each write touched, and the structure catches up with just
those (``changes_since``); a graph is rebuilt only when more than a tenth of it was replaced
or removed. A graph caught up in memory is saved on :meth:`LocalSearcher.close` and by
:meth:`LocalSearcher.prepare`. Beside an i8 or f16 graph the nodes' float32 vectors are saved
too (``<index>.vectors``, :mod:`..vectors`): its candidates are re-scored from there, memory-
mapped, and from the store's rows only for ids written since (or when the file is missing or
does not belong to the graph); writes since the file are laid over it in memory.

Building a graph of a million vectors takes minutes, so no search waits for one unless the
caller wants that (the default for a writable index, and ``prepare``, which ``themis-clip
index`` runs after indexing):

* ``background=True`` (the HTTP server): searches stay exact (complete, correct, slower)
  while a daemon thread tunes and builds on half the cores; the next search after it finishes
  switches to it, after catching it up with the writes made meanwhile.
* read-only without a current saved graph (one-shot CLI search): exact, since one exact query
  is far cheaper than a graph that could not be kept.

Searches run concurrently (the HTTP server runs them on a thread pool): they share a read
lock while they use the graph or matrix, and only bringing those up to date (after a write, or
when a background build finishes) takes the write lock, briefly unless it builds a graph.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.config import SearchConfig
from themis_clip.index.ann import HNSWIndex
from themis_clip.index.kernels import measure_exact_ms
from themis_clip.index.rwlock import ReadWriteLock
from themis_clip.index.searchers.structures import SELECTIVE_FILTER, Structures
from themis_clip.index.settings import GraphDType, SearchKind, SearchPlan
from themis_clip.index.stores.base import GraphFileStore
from themis_clip.index.tuning import tune
from themis_clip.index.vectors import VectorTable
from themis_clip.index.where import Where

__all__ = ["CATCH_UP_SHARE", "SELECTIVE_FILTER", "LocalSearcher"]

_Built = tuple[SearchPlan, HNSWIndex | None, VectorTable]

log = logging.getLogger(__name__)

#: A graph is rebuilt rather than caught up when more than this share of it changed.
CATCH_UP_SHARE = 0.1


class LocalSearcher:
    """Exact or graph search over a store's vectors, in this process.

    Args:
        store: the store (the graph's tag lives in its meta).
        graph_path: where the graph is saved (None: never saved).
        vectors_path: where the float32 vectors its candidates are re-scored with are saved
            (:mod:`..vectors`; None: beside the graph, ``.usearch`` → ``.vectors``).
        settings: the tuner's target recall, vector type and budgets.
        exact_threshold: a fixed rule instead of the measured one: collections at or below this
            size are searched exactly, larger ones always by graph.
        expansion_search, fixed: fixed graph parameters instead of measured ones.
        background: tune and build on a background thread while searches run exactly.
        progress: ``(phase, done, total)`` while a graph is built.
        location: the store's location, for messages.
    """

    def __init__(
        self,
        store: GraphFileStore,
        *,
        graph_path: Path | None,
        settings: SearchConfig,
        vectors_path: Path | None = None,
        exact_threshold: int | None = None,
        expansion_search: int | None = None,
        fixed: tuple[int, int] | None = None,
        background: bool = False,
        progress: Callable[[str, int, int], object] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.exact_threshold = exact_threshold
        self.expansion_search = expansion_search
        self.progress = progress
        self.location = str(store.path)
        self._fixed = fixed
        self._ann_path = graph_path
        if vectors_path is None and graph_path is not None:
            vectors_path = graph_path.with_suffix(".vectors")
        self._vectors_path = vectors_path
        #: The graph's candidates' float32 vectors (None: read from the store's rows).
        self._table: VectorTable | None = None
        self._cache_version = -1
        self._ids: npt.NDArray[np.int64] = np.empty(0, np.int64)
        self._matrix: npt.NDArray[np.float32] = np.empty((0, 0), np.float32)
        self._ann: HNSWIndex | None = None
        self._dirty = False  # the graph in memory is ahead of the saved file
        self._background = background
        #: A background build: (version, its plan, graph and the vectors it was built from).
        self._building: tuple[int, Future[_Built]] | None = None
        self._lock = ReadWriteLock()

    def close(self) -> None:
        """Save a graph caught up in memory (the store stays open: its owner closes it)."""
        with self._lock.write():
            if self._dirty and self._ann is not None and not self.store.readonly:
                self._save(self._ann)

    @property
    def plan(self) -> SearchPlan | None:
        return SearchPlan.from_json(self.store.meta().get("search_plan"))

    @property
    def building(self) -> bool:
        """Whether a background graph build is running."""
        return self._building is not None and not self._building[1].done()

    @property
    def mode(self) -> SearchKind:
        # Counting rows is a scan: only the fixed-threshold rule needs it (every response
        # reports the mode).
        if self.exact_threshold is not None and self.store.count() <= self.exact_threshold:
            return SearchKind.EXACT
        if self._graph_is_current() or self._saved_tag_is_current():
            return SearchKind.HNSW
        if self.exact_threshold is not None and not (self._background or self.store.readonly):
            return SearchKind.HNSW  # the next search builds the graph
        return SearchKind.EXACT

    def stats(self) -> dict[str, Any]:
        with self._lock.read():
            ann = self._ann
            if ann is None:
                return {}
            return {
                "graph": {
                    "dtype": ann.dtype,
                    "connectivity": ann.connectivity,
                    "expansion_search": ann.expansion_search,
                    "items": len(ann),
                    "bytes_per_item": ann.serialized_bytes / max(1, len(ann)),
                    "rescored_from": "store" if self._table is None else "vectors file",
                }
            }

    def search(
        self,
        query: npt.NDArray[np.float32],
        k: int,
        dim: int,
        *,
        where: Where | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        allowed = self._allowed_and_current(where, dim)
        with self._lock.read():  # a write since is caught up by the next search
            return self._structures().search(query, k, allowed, dim)

    def search_many(
        self,
        queries: npt.NDArray[np.float32],
        k: int,
        dim: int,
        *,
        where: Where | None = None,
    ) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]]:
        """:meth:`search` for each row of ``queries`` (``(n, dim)`` unit vectors), with the
        same results; the filter is read once (:meth:`.Structures.search_many`)."""
        allowed = self._allowed_and_current(where, dim)
        with self._lock.read():
            return self._structures().search_many(queries, k, allowed, dim)

    def _allowed_and_current(self, where: Where | None, dim: int) -> set[int] | None:
        """The ids ``where`` allows (None: all), with the structures caught up first."""
        allowed = self.store.ids_where(where) if where is not None else None
        if not self._is_current():
            with self._lock.write():
                self._refresh(dim)
        return allowed

    def current_graph(self, dim: int) -> HNSWIndex | None:
        """The graph searches use now, caught up with the store (None: searched exactly);
        for batch use cases such as near-duplicates (read only: never modify it)."""
        with self._lock.write():
            self._refresh(dim, build=False)
            return self._ann

    def _is_current(self) -> bool:
        """Nothing to bring up to date: no write since, no finished build to collect."""
        built = self._building is not None and self._building[1].done()
        return not built and self._cache_version == self.store.write_version

    def prepare(self, dim: int) -> bool:
        """Tune, build and save the graph now if the collection needs one and it is stale;
        save a graph caught up in memory. True if a graph was built."""
        with self._lock.write():
            return self._prepare(dim)

    def _prepare(self, dim: int) -> bool:
        forced = self.exact_threshold is not None
        if forced and self.store.count() <= (self.exact_threshold or 0):
            return False
        self._refresh(dim, build=False)  # the saved graph, caught up; else exact
        if self._ann is not None:
            if self._dirty:
                self._save(self._ann)
            return False
        plan = self.plan
        exact_planned = not forced and plan is not None and plan.kind == SearchKind.EXACT
        if exact_planned and not self._plan_is_stale(len(self._ids)):
            return False  # measured: exact search is the better choice at this size
        return self._tune_and_install(dim, threads=0)

    def _structures(self) -> Structures:
        """What a search reads now (under the read lock)."""
        return Structures(
            store=self.store,
            settings=self.settings,
            ann=self._ann,
            table=self._table,
            ids=self._ids,
            matrix=self._matrix,
        )

    # -- keeping the structures current --------------------------------------------------------

    def _graph_is_current(self) -> bool:
        return self._ann is not None and self._cache_version == self.store.write_version

    def _saved_tag_is_current(self) -> bool:
        meta = self.store.meta()
        return (
            self._ann_path is not None
            and meta.get("ann_version") == str(self.store.write_version)
            and self._ann_path.is_file()
        )

    def _plan_is_stale(self, count: int) -> bool:
        """Whether the measured plan no longer describes the collection (never tuned, or it has
        doubled or halved since)."""
        plan = self.plan
        return plan is None or not (plan.items / 2 <= count <= plan.items * 2)

    def _refresh(self, dim: int, *, build: bool = True) -> None:
        self._collect_background(dim)  # may install (and save: a new version) a built graph
        version = self.store.write_version
        if version == self._cache_version:
            return
        if self._cache_version >= 0 and self._catch_up(dim, version):
            if self._ann is not None:
                return
        else:
            forced = self.exact_threshold is not None
            if forced and self.store.count() <= (self.exact_threshold or 0):
                self._load_exact(dim, version)
                return
            plan = self.plan
            if (forced or (plan is not None and plan.kind == SearchKind.HNSW)) and self._load_saved(
                dim, version
            ):
                return
            self._load_exact(dim, version)
        if build:
            self._maybe_build(dim)

    def _maybe_build(self, dim: int) -> None:
        """Serving exactly: start measuring (and building) a graph if it may now pay off."""
        count = len(self._ids)
        if self.building:
            return
        if self.exact_threshold is not None:
            if count <= self.exact_threshold:
                return
        else:
            plan = self.plan
            if (
                plan is not None
                and plan.kind == SearchKind.EXACT
                and not self._plan_is_stale(count)
            ):
                return  # measured for about this size: exact is better
            if plan is None or self._plan_is_stale(count):
                exact_ms, _ = measure_exact_ms(self._matrix, self._matrix[:15])
                if exact_ms <= self.settings.exact_fast_ms:
                    return  # exact search is cheap: not worth measuring a graph yet
        if self._background:
            self._start_build(self._cache_version)
        elif self.store.readonly:
            log.info(
                "%s has no current search graph; searching exactly (`themis-clip index` builds it)",
                self.location,
            )
        else:
            self._tune_and_install(dim, threads=0)

    def _catch_up(self, dim: int, version: int) -> bool:
        """Bring the graph or matrix in use from ``_cache_version`` to ``version`` by applying
        just the rows written and removed since; False when a rebuild is better."""
        changed, vectors, removed = self.store.changes_since(self._cache_version, dim)
        ann = self._ann
        if ann is not None:
            if ann.view:
                return False  # a memory-mapped graph cannot change
            existing = ann.keys()
        else:
            existing = self._ids
        drop = np.union1d(removed, changed)
        drop = drop[np.isin(drop, existing)]
        if ann is not None:
            if len(drop) > CATCH_UP_SHARE * len(existing) + 100:
                return False  # too many holes: a fresh graph searches better
            count = len(existing) - len(drop) + len(changed)
            if self.exact_threshold is None and self._plan_is_stale(count):
                return False  # the collection outgrew the plan: measure again
            ann.remove(drop)
            ann.add(changed, vectors, threads=0)
            if self._table is not None:
                self._table = self._table.with_rows(changed, vectors)
            self._dirty = self._dirty or bool(len(drop) or len(changed))
        else:
            keep = ~np.isin(self._ids, drop)
            self._ids = np.concatenate([self._ids[keep], changed])
            self._matrix = np.concatenate([self._matrix[keep], vectors.reshape(-1, dim)])
        self._cache_version = version
        return True

    def _load_exact(self, dim: int, version: int) -> None:
        self._ids, self._matrix = self.store.load_vectors(dim)
        self._ann = self._table = None
        self._dirty = False
        self._cache_version = version

    def _use(self, ann: HNSWIndex, version: int, table: VectorTable | None) -> None:
        self._ann = ann  # the exact-search matrix is no longer needed: free it
        self._table = table
        self._ids, self._matrix = np.empty(0, np.int64), np.empty((0, 0), np.float32)
        self._cache_version = version

    def _drop_graph(self) -> None:
        self._ann, self._table, self._cache_version = None, None, -1

    def _load_saved(self, dim: int, version: int) -> bool:
        """Use the saved graph: memory-mapped when current and read-only, loaded and caught up
        when it is behind and the index is writable."""
        if self._ann_path is None:
            return False
        tag = self.store.meta().get("ann_version")
        if tag is None or not tag.isdigit():
            return False
        saved_at = int(tag)
        if saved_at != version and self.store.readonly:
            return False
        plan = self.plan
        ef = self.expansion_search or (plan.expansion_search if plan else None) or 64
        graph = HNSWIndex.open(self._ann_path, view=self.store.readonly, expansion_search=ef)
        if graph is None:
            return False
        table = None
        if self._vectors_path is not None and graph.dtype != GraphDType.F32:
            table = VectorTable.open_current(
                self._vectors_path,
                dim=dim,
                count=len(graph),
                tag=saved_at,
                stored=lambda ids: self.store.vectors_by_id(ids.tolist(), dim),
            )
        if table is None and graph.dtype != GraphDType.F32 and not self.store.readonly:
            # An index saved before vectors files (or with a stale one): write one with the
            # graph on the next save; until then the store's rows serve.
            self._dirty = True
        self._use(graph, saved_at, table)
        if saved_at == version or self._catch_up(dim, version):
            return True
        self._drop_graph()
        return False

    def _tune(
        self,
        ids: npt.NDArray[np.int64],
        matrix: npt.NDArray[np.float32],
        *,
        threads: int,
    ) -> tuple[SearchPlan, HNSWIndex | None]:
        log.info("measuring search over %s (%d vectors)", self.location, len(ids))
        plan, graph = tune(
            ids,
            matrix,
            self.settings,
            threads=threads,
            force_graph=self.exact_threshold is not None,
            fixed=self._fixed,
            fixed_expansion_search=self.expansion_search,
            progress=self.progress,
        )
        log.info("search plan for %s: %s: %s", self.location, plan.kind, plan.reason)
        return plan, graph

    def _tune_and_install(self, dim: int, *, threads: int) -> bool:
        version = self.store.write_version
        if self._ann is not None or self._cache_version != version:
            self._load_exact(dim, version)
        table = VectorTable.of(self._ids, self._matrix)  # a copy only if not in id order
        plan, graph = self._tune(self._ids, self._matrix, threads=threads)
        return self._install(plan, graph, version, dim, table)

    def _collect_background(self, dim: int) -> None:
        if self._building is None or not self._building[1].done():
            return
        built, future = self._building
        self._building = None
        try:
            plan, graph, table = future.result()
        except Exception as exc:  # a failed build leaves exact search serving
            log.warning("building the search graph for %s failed: %s", self.location, exc)
            return
        self._install(plan, graph, built, dim, table)

    def _install(
        self,
        plan: SearchPlan,
        graph: HNSWIndex | None,
        version: int,
        dim: int,
        table: VectorTable,
    ) -> bool:
        """Record ``plan``; serve ``graph`` (built for ``version`` from ``table``'s vectors),
        caught up with later writes, and save it when the index is writable."""
        if not self.store.readonly:
            self.store.set_meta({"search_plan": plan.to_json()})
        if graph is None:
            if self._ann is not None:
                self._drop_graph()
            return False
        self._use(graph, version, table if graph.dtype != GraphDType.F32 else None)
        current = self.store.write_version
        if current != version and not self._catch_up(dim, current):
            self._drop_graph()  # too much changed meanwhile: rebuild
            return True
        if not self.store.readonly:
            self._save(graph)
        return True

    def _save(self, graph: HNSWIndex) -> None:
        assert self._ann_path is not None
        graph.save(self._ann_path)
        if self._vectors_path is not None and graph.dtype != GraphDType.F32:
            # The nodes' float32 vectors beside the graph, then served memory-mapped from there.
            source = self._table
            if source is None:  # a graph saved before vectors files: one scan of the store
                source = VectorTable.of(*self.store.load_vectors(graph.ndim))
            self._table = source.save_for(
                self._vectors_path, graph.keys(), version=self._cache_version
            )
        # The tag records the version the graph matches (writing it is a version of its own).
        tag = self.store.tag_graph(self._cache_version)
        if tag > self._cache_version:
            self._cache_version = tag
        self._dirty = False

    def _start_build(self, version: int) -> None:
        """Tune and build on a daemon thread from a snapshot of the vectors (no store use
        off-thread)."""
        ids, matrix = self._ids, self._matrix
        future: Future[_Built] = Future()
        threads = max(1, (os.cpu_count() or 2) // 2)  # leave cores to the embedding sessions

        def work() -> None:
            try:
                plan, graph = self._tune(ids, matrix, threads=threads)
                future.set_result((plan, graph, VectorTable.of(ids, matrix)))
            except BaseException as exc:
                future.set_exception(exc)

        self._building = (version, future)
        threading.Thread(target=work, name="themis-hnsw-build", daemon=True).start()
