"""Search over a store: :class:`VectorIndex`, the index's one entry point.

The store is the source of truth (:mod:`.stores`); a searcher (:mod:`.searchers`) answers the
queries over it, picked once when the index opens: the local one (exact numpy, or an HNSW
graph cached beside an SQLite file as ``<index>.usearch``) or PostgreSQL's own (pgvector's HNSW
index, so several servers share one index).

Exact or graph is measured, not fixed (:mod:`.tuning`): when exact search over the collection costs
more than ``exact_fast_ms``, the tuner builds a graph and widens its search until it reaches the
target recall@10, and keeps it when that is faster than exact search (otherwise, as on random-like
data, exact search). The plan it measured (:class:`~.settings.SearchPlan`) is kept in the index's
metadata and reported by :meth:`VectorIndex.stats`; it is measured again when the collection has
doubled or halved since. Graphs hold i8 (default) or f16 vectors; their top candidates are re-scored
exactly with the stored float32 vectors (kept memory-mapped beside the graph as ``<index>.vectors``,
:mod:`.vectors`). How graphs catch up with writes and when they are built is the local searcher's
(:mod:`.searchers.local`). :meth:`VectorIndex.search_many` answers many queries at once (one graph
batch on every core).

Thread safety: searches may run concurrently with each other (the HTTP server runs them on a
thread pool); each searcher serialises only what changes its own structures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.config import SearchConfig
from themis_clip.errors import IndexModelMismatchError, MetadataError, SearchIndexError
from themis_clip.index.kernels import top_k
from themis_clip.index.searchers.base import Searcher
from themis_clip.index.settings import SearchKind, SearchPlan
from themis_clip.index.stores import Facets, Store, StoredItem, drop_store, is_url, open_store
from themis_clip.index.vectors import VECTORS_SUFFIX
from themis_clip.index.where import Where, equals_keys, parse_where
from themis_clip.vocabulary import ModelIdentity

__all__ = ["GRAPH_SUFFIX", "MAX_K", "Hit", "VectorIndex", "top_k"]

log = logging.getLogger(__name__)

#: The saved HNSW graph lives beside the database as ``<index>`` + this suffix.
GRAPH_SUFFIX = ".usearch"
#: Most results one search may ask for.
MAX_K = 10_000
#: Hits' records read per store query by :meth:`VectorIndex.search_many`.
_RECORDS_PER_READ = 2_000


@dataclass(frozen=True, kw_only=True)
class Hit:
    """One result. ``text_matches``: the lines of text read in the item (OCR) that a lexical
    or hybrid query's words matched, ``{"text", "box": 4 [x, y] points, "confidence",
    "frame": [width, height]}`` (the picture's upright size the box is measured in)."""

    key: str
    score: float
    path: str | None
    metadata: dict[str, Any] | None
    text_matches: tuple[dict[str, Any], ...] = ()


class VectorIndex:
    """Items with vectors, searchable by vector.

    Args:
        location: the SQLite file, or a ``postgresql://`` URL.
        readonly: open without writing (a saved HNSW graph is then memory-mapped).
        exact_threshold: a fixed rule instead of the measured one: collections at or below this
            size are searched exactly, larger ones always by graph.
        expansion_search, connectivity, expansion_add: fixed graph parameters instead of
            measured ones (None: the tuner chooses).
        settings: the tuner's target recall, vector type and budgets.
        background_build: tune and build a graph on a background thread while searches run
            exactly (see the module docstring); False: the next search builds it.
        progress: ``(phase, done, total)`` while a graph is built (the CLI's progress bar).
    """

    def __init__(
        self,
        location: str | Path,
        *,
        readonly: bool = False,
        exact_threshold: int | None = None,
        expansion_search: int | None = None,
        connectivity: int | None = None,
        expansion_add: int | None = None,
        settings: SearchConfig | None = None,
        background_build: bool = False,
        progress: Callable[[str, int, int], object] | None = None,
    ) -> None:
        self.store: Store = open_store(location, readonly=readonly)
        self.location = str(self.store.path)  # for messages: a URL without its password
        self.settings = settings or SearchConfig()
        try:
            self.searcher: Searcher = self._searcher_for(
                location,
                exact_threshold=exact_threshold,
                expansion_search=expansion_search,
                fixed=(
                    (connectivity, expansion_add or 4 * connectivity)
                    if connectivity is not None
                    else None
                ),
                background=background_build,
                progress=progress,
            )
        except BaseException:
            self.store.close()
            raise

    def _searcher_for(
        self,
        location: str | Path,
        *,
        exact_threshold: int | None,
        expansion_search: int | None,
        fixed: tuple[int, int] | None,
        background: bool,
        progress: Callable[[str, int, int], object] | None,
    ) -> Searcher:
        """The searcher for this store, chosen once: PostgreSQL searches itself, every other
        store is searched here."""
        from themis_clip.index.stores.postgres import PgStore

        if isinstance(self.store, PgStore):
            from themis_clip.index.searchers.postgres import PgSearcher

            return PgSearcher(
                self.store, self.settings, expansion_search=expansion_search, progress=progress
            )
        from themis_clip.index.searchers.local import LocalSearcher
        from themis_clip.index.stores.sqlite import SQLiteStore

        assert isinstance(self.store, SQLiteStore)  # the stores there are: open_store
        return LocalSearcher(
            self.store,
            graph_path=Path(str(location) + GRAPH_SUFFIX),
            vectors_path=Path(str(location) + VECTORS_SUFFIX),
            settings=self.settings,
            exact_threshold=exact_threshold,
            expansion_search=expansion_search,
            fixed=fixed,
            background=background,
            progress=progress,
        )

    def close(self) -> None:
        try:
            self.searcher.close()
        finally:
            self.store.close()

    @staticmethod
    def files(path: str | Path) -> list[Path]:
        """Every file an index at ``path`` may consist of: the database, SQLite's write-ahead
        log and shared-memory files, the saved HNSW graph and its float32 vectors."""
        suffixes = ("", "-wal", "-shm", GRAPH_SUFFIX, VECTORS_SUFFIX)
        return [Path(str(path) + suffix) for suffix in suffixes]

    @staticmethod
    def remove(location: str | Path) -> None:
        """Delete an index with all its side files (a PostgreSQL index: its tables)."""
        drop_store(location)
        if not is_url(location):
            Path(str(location) + GRAPH_SUFFIX).unlink(missing_ok=True)
            Path(str(location) + VECTORS_SUFFIX).unlink(missing_ok=True)

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
            self.store.expect_model(stamp.sha256)
            return
        if current.sha256 != stamp.sha256 or current.dim != stamp.dim:
            raise IndexModelMismatchError(
                f"this index was built with model {current.model_id} "
                f"({current.dim}-d); "
                f"the current model is {stamp.model_id} ({stamp.dim}-d), whose vectors are not "
                f"comparable. Re-index with this model (`themis-clip index DIR --index NEW_PATH`, "
                f"or --rebuild to replace this index), or load model {current.model_id} again."
            )
        self.store.expect_model(stamp.sha256)

    # -- search --------------------------------------------------------------------------------

    def search(
        self,
        query: npt.NDArray[np.float32],
        k: int = 10,
        *,
        where: Mapping[str, Any] | Where | None = None,
    ) -> list[Hit]:
        """Top ``k`` items by cosine similarity to the unit vector ``query``, among those whose
        metadata satisfies ``where`` (the filter language of :mod:`.where`, or its tree with
        ``filters`` in it: :func:`.where.with_filters`; raises
        :class:`~themis_clip.errors.WhereError`)."""
        ids, scores = self._nearest(query, k, where)
        return _hits(ids, scores, self.store.items_by_id(ids.tolist()))

    def nearest(
        self,
        query: npt.NDArray[np.float32],
        k: int = 10,
        *,
        where: Mapping[str, Any] | Where | None = None,
    ) -> list[tuple[int, str, float]]:
        """:meth:`search`'s ranking as ``(id, key, score)``, best first, with only the keys
        read: a page of results ranks a window of them and reads the records of its own."""
        ids, scores = self._nearest(query, k, where)
        keys = self.store.keys_by_id(ids.tolist())
        return [
            (i, keys[i], s)
            for i, s in zip(ids.tolist(), scores.tolist(), strict=True)
            if i in keys  # an id deleted meanwhile is left out
        ]

    def _nearest(
        self,
        query: npt.NDArray[np.float32],
        k: int,
        where: Mapping[str, Any] | Where | None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        condition = parse_where(where) if isinstance(where, Mapping) else where
        if not 1 <= int(k) <= MAX_K:
            raise SearchIndexError(f"k = {k}: expected 1 to {MAX_K}")
        stamp = self.stamp
        if stamp is None:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        query = np.asarray(query, dtype=np.float32).reshape(-1)
        if query.shape != (stamp.dim,):
            raise IndexModelMismatchError(
                f"query has {query.shape[0]} dimensions, the index {stamp.dim}"
            )
        if not np.all(np.isfinite(query)):
            raise SearchIndexError("the query vector has NaN or infinite components")
        ids, scores = self.searcher.search(query, k, stamp.dim, where=condition)
        if not len(ids):  # only then can a key be unknown (no second scan before)
            self.check_keys(condition)
        return np.asarray(ids, dtype=np.int64), np.asarray(scores, dtype=np.float32)

    def search_many(
        self,
        queries: npt.NDArray[np.float32],
        k: int = 10,
        *,
        where: Mapping[str, Any] | Where | None = None,
    ) -> list[list[Hit]]:
        """:meth:`search` for each row of ``queries``, with the same results, at a lower cost
        per query: the filter is read once, a graph searches the queries as one batch on
        every core (unfiltered), and the hits' records are read together.

        Args:
            queries: ``(n, dim)`` unit vectors (float32).
            k, where: as for :meth:`search`, the same for every query.

        Returns:
            One list of hits per query, in the order of ``queries``.
        """
        condition = parse_where(where) if isinstance(where, Mapping) else where
        if not 1 <= int(k) <= MAX_K:
            raise SearchIndexError(f"k = {k}: expected 1 to {MAX_K}")
        stamp = self.stamp
        matrix = np.asarray(queries, dtype=np.float32)
        if matrix.ndim != 2:
            raise SearchIndexError(
                f"queries: expected an (n, dim) matrix, got {matrix.ndim} dimensions"
            )
        if stamp is None:
            return [[] for _ in matrix]
        if matrix.shape[1] != stamp.dim:
            raise IndexModelMismatchError(
                f"queries have {matrix.shape[1]} dimensions, the index {stamp.dim}"
            )
        if not np.all(np.isfinite(matrix)):
            bad = int(np.flatnonzero(~np.isfinite(matrix).all(axis=1))[0])
            raise SearchIndexError(f"query {bad} has NaN or infinite components")
        if not len(matrix):
            return []
        many = getattr(self.searcher, "search_many", None)  # PostgreSQL: one query at a time
        if many is not None:
            found = many(np.ascontiguousarray(matrix), k, stamp.dim, where=condition)
        else:
            found = [self.searcher.search(q, k, stamp.dim, where=condition) for q in matrix]
        if any(not len(ids) for ids, _ in found):
            self.check_keys(condition)
        wanted = list(dict.fromkeys(int(i) for ids, _ in found for i in ids))
        items: dict[int, StoredItem] = {}
        for start in range(0, len(wanted), _RECORDS_PER_READ):
            items.update(self.store.items_by_id(wanted[start : start + _RECORDS_PER_READ]))
        return [_hits(ids, scores, items) for ids, scores in found]

    def check_keys(self, where: Where | None) -> None:
        """Raise :class:`MetadataError` for a ``filters`` term (:class:`.where.Equals`) on a
        key no item has: a mistake (a typo, or the wrong index), so say so."""
        keys = equals_keys(where)
        if not keys or not isinstance(self.store, Facets):
            return
        present = self.store.metadata_keys_present(keys)  # once: it was once per key
        unknown = [k for k in keys if k not in present]
        if unknown and self.store.count():
            known = [f["key"] for f in self.store.metadata_facets(max_keys=20, max_values=0)]
            raise MetadataError(
                f"filters: no item in this index has the metadata key "
                f"{', '.join(repr(k) for k in unknown)}; keys it has: "
                f"{', '.join(repr(k) for k in known) or 'none'}"
            )

    def search_like(
        self,
        key: str,
        k: int = 10,
        *,
        where: Mapping[str, Any] | Where | None = None,
    ) -> list[Hit]:
        """ "More like this": the top ``k`` items by similarity to item ``key``'s stored vector
        (the item itself first). Raises KeyError when there is no such item."""
        vector = self.store.vector(key)
        if vector is None:
            raise KeyError(key)
        norm = float(np.linalg.norm(vector))
        return self.search(vector / norm if norm > 0 else vector, k, where=where)

    @property
    def progress(self) -> Callable[[str, int, int], object] | None:
        """``(phase, done, total)`` while a search structure is built (settable)."""
        return self.searcher.progress

    @progress.setter
    def progress(self, value: Callable[[str, int, int], object] | None) -> None:
        self.searcher.progress = value

    # -- what the next search does ---------------------------------------------------------

    @property
    def plan(self) -> SearchPlan | None:
        """The tuner's last measured plan for this index (None: never tuned)."""
        return SearchPlan.from_json(self.store.meta().get("search_plan"))

    @property
    def mode(self) -> SearchKind:
        """``"exact"``, ``"hnsw"`` (our graph) or ``"pgvector"``: how the next search runs."""
        return self.searcher.mode

    @property
    def graph_building(self) -> bool:
        """Whether a background graph build is running."""
        return self.searcher.building

    def stats(self) -> dict[str, Any]:
        """Size, mode, the tuner's measured plan and bytes per item (graph and store)."""
        count = self.store.count()
        plan = self.plan
        out: dict[str, Any] = {
            "items": count,
            "mode": self.mode,
            "graph_building": self.graph_building,
            "store": self.store.kind,
            "store_bytes_per_item": (self.store.size_bytes() / count) if count else None,
            "plan": plan.to_dict() if plan else None,
        }
        out.update(self.searcher.stats())
        return out

    def prepare_graph(self) -> bool:
        """Tune, build and save the search graph now if the collection needs one and it is
        stale (``themis-clip index`` runs this); save a graph caught up in memory.

        Returns:
            True if a graph was built.
        """
        stamp = self.stamp
        if stamp is None:
            return False
        return self.searcher.prepare(stamp.dim)


def _hits(
    ids: npt.NDArray[np.int64], scores: npt.NDArray[np.float32], items: Mapping[int, StoredItem]
) -> list[Hit]:
    """The hits for ``ids`` in order, from their records (an id deleted meanwhile is left out)."""
    out = []
    for i, s in zip(np.asarray(ids).tolist(), np.asarray(scores).tolist(), strict=True):
        item = items.get(i)
        if item is not None:
            out.append(Hit(key=item.key, score=s, path=item.path, metadata=item.metadata))
    return out
