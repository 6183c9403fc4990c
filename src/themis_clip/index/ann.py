"""The only module that imports ``usearch``: an HNSW graph over the store's vectors.

Chosen over hnswlib because usearch is actively maintained, removes and adds incrementally,
holds vectors as f32, f16 or i8, and can *view* a saved index through a memory map (read-only
opens cost no load time and no private memory). Its parameters are not fixed here: the
self-tuner (:mod:`.tuning`) measures which ones a collection needs.

The vectors are unit length, so cosine and inner product agree and every graph uses "ip": faster
than "cos" at f16, and at i8 faster in three of four runs (0.9-2.1x), with equal or higher
recall after re-scoring and a 25-40 % faster build (100k embedding-like vectors; bench/RESULTS.md):
"cos" renormalises the quantised vectors at every distance.
On f32/f16 the distance is ``1 - cosine``. On i8 it is ``1 - (integer product)`` of the
components scaled by 127 (and truncated), so :meth:`HNSWIndex.search` divides by 127² and the
score is a rough cosine; callers re-score compact graphs' candidates from float32 anyway.
Graphs saved with "cos" (before this change) load and score as they were built.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["DTYPES", "HNSWIndex"]

#: Vector types the graph can hold: bytes per component 4, 2 and 1.
DTYPES = ("f32", "f16", "i8")

#: usearch stores an i8 component as the float times 127.
I8_SCALE = 127.0


class HNSWIndex:
    """Cosine HNSW over unit vectors, keyed by the store's integer ids."""

    def __init__(self, index: object, *, view: bool = False) -> None:
        self._index = index
        self.view = view  # a memory-mapped saved graph: searchable, not modifiable
        integer_products = self.dtype == "i8" and self.metric == "ip"
        self._product_scale = 1.0 / I8_SCALE**2 if integer_products else 1.0

    @classmethod
    def build(
        cls,
        ids: npt.NDArray[np.int64],
        vectors: npt.NDArray[np.float32],
        *,
        connectivity: int = 16,
        expansion_add: int = 64,
        expansion_search: int = 64,
        dtype: str = "f32",
        threads: int = 0,
        progress: Callable[[int, int], object] | None = None,
    ) -> HNSWIndex:
        """Build a graph over ``vectors`` keyed by ``ids`` (``threads`` 0: every core).

        ``progress(done, total)`` is called from the insertion threads as vectors go in.
        """
        from usearch.index import Index

        if dtype not in DTYPES:
            raise ValueError(f"graph vector type {dtype!r}: expected one of {', '.join(DTYPES)}")
        index = Index(
            ndim=vectors.shape[1],
            metric="ip",
            dtype=dtype,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )
        graph = cls(index)
        graph.add(ids, vectors, threads=threads, progress=progress)
        return graph

    @classmethod
    def open(cls, path: Path, *, view: bool, expansion_search: int = 64) -> HNSWIndex | None:
        """Load (or, with ``view``, memory-map) a saved index; None if missing or unreadable."""
        from usearch.index import Index

        if not path.is_file():
            return None
        try:
            index = Index.restore(str(path), view=view)
        except Exception:  # a truncated or foreign file: the caller rebuilds from the store
            return None
        if index is None:
            return None
        graph = cls(index, view=view)
        graph.expansion_search = expansion_search
        return graph

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        self._index.save(str(tmp))  # type: ignore[attr-defined]
        tmp.replace(path)  # readers never see a half-written file

    def __len__(self) -> int:
        return len(self._index)  # type: ignore[arg-type]

    @property
    def dtype(self) -> str:
        return str(self._index.dtype).rsplit(".", 1)[-1].lower()  # type: ignore[attr-defined]

    @property
    def metric(self) -> str:
        """``"ip"`` or ``"cos"`` (i8 graphs saved before every graph used "ip")."""
        kind = str(self._index.metric_kind).rsplit(".", 1)[-1].lower()  # type: ignore[attr-defined]
        return "cos" if kind == "cos" else "ip"

    @property
    def connectivity(self) -> int:
        return int(self._index.connectivity)  # type: ignore[attr-defined]

    @property
    def expansion_search(self) -> int:
        return int(self._index.expansion_search)  # type: ignore[attr-defined]

    @expansion_search.setter
    def expansion_search(self, value: int) -> None:
        self._index.expansion_search = int(value)  # type: ignore[attr-defined]

    @property
    def serialized_bytes(self) -> int:
        """The graph's size saved (and so its resident size when memory-mapped)."""
        return int(self._index.serialized_length)  # type: ignore[attr-defined]

    def keys(self) -> npt.NDArray[np.int64]:
        return np.asarray(self._index.keys, dtype=np.int64)  # type: ignore[attr-defined]

    def add(
        self,
        ids: npt.NDArray[np.int64],
        vectors: npt.NDArray[np.float32],
        *,
        threads: int = 0,
        progress: Callable[[int, int], object] | None = None,
    ) -> None:
        """Insert vectors (their ids must not be in the graph; :meth:`remove` them first)."""
        if not len(ids):
            return
        callback = None
        if progress is not None:

            def callback(done: int, total: int) -> bool:
                progress(done, total)
                return True  # go on

            # usearch checks the callback's annotations as types (here strings: PEP 563).
            callback.__annotations__ = {"done": int, "total": int, "return": bool}

        self._index.add(  # type: ignore[attr-defined]
            ids.astype(np.uint64),
            np.ascontiguousarray(vectors, dtype=np.float32),
            threads=threads,
            progress=callback,
        )

    def remove(self, ids: npt.NDArray[np.int64]) -> None:
        if len(ids):
            self._index.remove(ids.astype(np.uint64))  # type: ignore[attr-defined]

    def search(
        self, query: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Top ``k`` ``(ids, approximate cosine scores)`` for one unit query, best first."""
        # One query: one thread (a pool for one query only costs).
        matches = self._index.search(  # type: ignore[attr-defined]
            np.asarray(query, dtype=np.float32), k, threads=1
        )
        keys = np.asarray(matches.keys, dtype=np.int64)
        scores = (1.0 - np.asarray(matches.distances, dtype=np.float32)) * self._product_scale
        return keys, scores.astype(np.float32)

    def search_many(
        self, queries: npt.NDArray[np.float32], k: int, *, threads: int = 0
    ) -> npt.NDArray[np.int64]:
        """Top ``k`` ids for each row of ``queries``; a row with fewer matches ends in ``-1``."""
        matches = self._index.search(  # type: ignore[attr-defined]
            np.ascontiguousarray(queries, dtype=np.float32), k, threads=threads
        )
        keys = np.asarray(matches.keys, dtype=np.int64).reshape(len(queries), -1)
        counts = np.asarray(matches.counts).reshape(-1)
        for row, found in enumerate(counts):
            keys[row, int(found) :] = -1
        return keys
