"""The only module that imports ``usearch``: an HNSW graph over the store's vectors.

Chosen over hnswlib because usearch is actively maintained, removes and adds incrementally,
holds vectors as f32, f16 or i8, and can *view* a saved index through a memory map (read-only
opens cost no load time and no private memory). Its parameters are not fixed here: the
self-tuner (:mod:`.tuning`) measures which ones a collection needs.

The vectors are unit length, so cosine and inner product agree and every graph uses "ip": faster
than "cos" at f16, and at i8 faster in three of four runs (0.9-2.1x), with equal or higher
recall after re-scoring and a 25-40 % faster build (100k embedding-like vectors; bench/RESULTS.md):
"cos" renormalises the quantised vectors at every distance.
On f32/f16 the distance is ``1 - cosine``. On i8 it is ``1 - (integer product)``.

i8 codes are made here, not by usearch. usearch would scale a unit vector's components by 127
and truncate, but a 512-d embedding's components are ~0.04 (times 127: about ±5 of the 255
levels), and the quantisation noise then misranks close neighbours (recall@10 0.975 at breadth
256 on 1M embedding-like vectors). This module stretches them first: ``round(x * 127 * scale)``,
clipped to ±127, with ``scale`` the largest power of √2 that clips at most one vector in a
thousand, and only its largest component. On that data the scale is 4 and recall at 256 is
0.980-0.982, as hnswlib's on float32 (bench/RESULTS.md, run G).
Every vector and query of one graph uses the same scale, so the ranking is the integer product's;
:meth:`HNSWIndex.search` divides by (127 · scale)² and the score is a rough cosine (callers
re-score compact graphs' candidates from float32 anyway). The scale is not stored beside the
graph: the stored codes' norm is 127 · scale, and a graph reads it back from them when it opens,
so the graph file describes itself. Graphs usearch quantised (scale 1) read back as 1, and i8
graphs saved with "cos" (before every graph used "ip") take floats and score as they were built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from themis_clip.index.settings import GraphDType

__all__ = ["DTYPES", "HNSWIndex"]

#: Vector types the graph can hold (the one list is :class:`GraphDType`).
DTYPES = tuple(GraphDType)

#: An i8 code is a component times 127 times the graph's scale.
I8_SCALE = 127.0

#: The scales an i8 graph can use: powers of √2, far enough apart to read back unambiguously.
I8_STRETCHES: tuple[float, ...] = tuple(2.0 ** (step / 2) for step in range(15))

#: At most this share of a graph's vectors may have their largest component clipped.
I8_CLIPPED_SHARE = 0.001

#: Rows quantised at a time (bounds the temporary float copy).
_CHUNK = 65_536


def choose_i8_stretch(vectors: npt.NDArray[np.float32]) -> float:
    """The largest of :data:`I8_STRETCHES` that clips at most :data:`I8_CLIPPED_SHARE` of
    ``vectors`` (judged on a sample of up to 20,000)."""
    rows = np.asarray(vectors, dtype=np.float32)
    if len(rows) > 20_000:
        rows = rows[np.linspace(0, len(rows) - 1, 20_000).astype(np.int64)]
    peaks = np.abs(rows).max(axis=1) if rows.size else np.ones(1, np.float32)
    peak = float(np.quantile(peaks, 1.0 - I8_CLIPPED_SHARE))
    fitting = [s for s in I8_STRETCHES if s * peak <= 1.0]
    return fitting[-1] if fitting else 1.0


def i8_codes(vectors: npt.NDArray[np.float32], stretch: float) -> npt.NDArray[np.int8]:
    """``round(x * 127 * stretch)``, clipped to ±127."""
    scaled = np.rint(np.asarray(vectors, dtype=np.float32) * np.float32(I8_SCALE * stretch))
    codes: npt.NDArray[np.int8] = np.clip(scaled, -I8_SCALE, I8_SCALE).astype(np.int8)
    return codes


def _stored_stretch(index: object) -> float | None:
    """The scale a graph's codes were made with, from their norms (None: the graph is empty)."""
    count = len(index)  # type: ignore[arg-type]
    if not count:
        return None
    sample = np.asarray(index.keys[: min(count, 64)], dtype=np.uint64)  # type: ignore[attr-defined]
    codes = np.stack(index.get(sample)).astype(np.float32)  # type: ignore[attr-defined]
    norm = float(np.median(np.linalg.norm(codes.reshape(len(sample), -1), axis=1)))
    if norm <= 0:
        return 1.0
    step = round(2 * float(np.log2(norm / I8_SCALE)))
    return I8_STRETCHES[min(max(step, 0), len(I8_STRETCHES) - 1)]


def _callback(
    progress: Callable[[int, int], object] | None, offset: int, total: int
) -> Callable[[int, int], bool] | None:
    """usearch's progress callback for one ``add`` call, reporting ``offset`` rows already in."""
    if progress is None:
        return None

    def callback(done: int, of: int) -> bool:
        progress(offset + done, total)
        return True  # go on

    # usearch checks the callback's annotations as types (here strings: PEP 563).
    callback.__annotations__ = {"done": int, "of": int, "return": bool}
    return callback


class HNSWIndex:
    """Cosine HNSW over unit vectors, keyed by the store's integer ids."""

    def __init__(self, index: object, *, view: bool = False) -> None:
        self._index = index
        self.view = view  # a memory-mapped saved graph: searchable, not modifiable
        #: i8 on "ip": codes are made here (module doc); the stretch is set by the first vectors.
        self._coded = self.dtype == GraphDType.I8 and self.metric == "ip"
        self._stretch = _stored_stretch(index) if self._coded else None

    @classmethod
    def build(
        cls,
        ids: npt.NDArray[np.int64],
        vectors: npt.NDArray[np.float32],
        *,
        connectivity: int = 16,
        expansion_add: int = 64,
        expansion_search: int = 64,
        dtype: str = GraphDType.F32,
        threads: int = 0,
        progress: Callable[[int, int], object] | None = None,
        i8_stretch: float | None = None,
    ) -> HNSWIndex:
        """Build a graph over ``vectors`` keyed by ``ids`` (``threads`` 0: every core).

        ``progress(done, total)`` is called from the insertion threads as vectors go in.
        ``i8_stretch`` fixes an i8 graph's scale (see :func:`choose_i8_stretch`) when
        ``vectors`` are only the first of those it will hold; by default they choose it.
        """
        from usearch.index import Index

        if dtype not in DTYPES:
            raise ValueError(f"graph vector type {dtype!r}: expected one of {', '.join(DTYPES)}")
        index = Index(
            ndim=vectors.shape[1],
            metric="ip",
            dtype=str(dtype),
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )
        graph = cls(index)
        if graph._coded and i8_stretch is not None:
            if i8_stretch not in I8_STRETCHES:
                raise ValueError(f"i8 stretch {i8_stretch}: expected a power of √2 up to 128")
            graph._stretch = i8_stretch
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

    @functools.cached_property
    def dtype(self) -> str:  # fixed for a graph's life (cached: every search asks)
        return str(self._index.dtype).rsplit(".", 1)[-1].lower()  # type: ignore[attr-defined]

    @functools.cached_property
    def metric(self) -> str:
        """``"ip"`` or ``"cos"`` (i8 graphs saved before every graph used "ip")."""
        kind = str(self._index.metric_kind).rsplit(".", 1)[-1].lower()  # type: ignore[attr-defined]
        return "cos" if kind == "cos" else "ip"

    @property
    def ndim(self) -> int:
        return int(self._index.ndim)  # type: ignore[attr-defined]

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
    def i8_stretch(self) -> float | None:
        """The factor i8 codes are stretched by beyond 127 (None: not an i8 graph coded here,
        or still empty)."""
        return self._stretch

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
        keys = ids.astype(np.uint64)
        if not self._coded:
            self._index.add(  # type: ignore[attr-defined]
                keys,
                np.ascontiguousarray(vectors, dtype=np.float32),
                threads=threads,
                progress=_callback(progress, 0, len(keys)),
            )
            return
        if self._stretch is None:
            self._stretch = choose_i8_stretch(vectors)
        for start in range(0, len(keys), _CHUNK):  # quantised a slice at a time
            chunk = slice(start, start + _CHUNK)
            self._index.add(  # type: ignore[attr-defined]
                keys[chunk],
                i8_codes(vectors[chunk], self._stretch),
                threads=threads,
                progress=_callback(progress, start, len(keys)),
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
            self._query(np.asarray(query, dtype=np.float32)), k, threads=1
        )
        keys = np.asarray(matches.keys, dtype=np.int64)
        scores = (1.0 - np.asarray(matches.distances, dtype=np.float32)) * self._score_scale
        return keys, scores.astype(np.float32)

    @property
    def _score_scale(self) -> float:
        return 1.0 / (I8_SCALE * (self._stretch or 1.0)) ** 2 if self._coded else 1.0

    def _query(self, queries: npt.NDArray[np.float32]) -> npt.NDArray[np.float32 | np.int8]:
        return i8_codes(queries, self._stretch or 1.0) if self._coded else queries

    def search_batch(
        self, queries: npt.NDArray[np.float32], k: int, *, threads: int = 0
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Top ``k`` of each row of ``queries`` as one batch (``threads`` 0: every core):
        ``(ids [n, k], approximate scores [n, k], counts [n])``, each row's ``counts`` matches
        first and best first, as :meth:`search` finds them (each query is searched alone)."""
        if not len(queries):
            return np.empty((0, k), np.int64), np.empty((0, k), np.float32), np.empty(0, np.int64)
        matches = self._index.search(  # type: ignore[attr-defined]
            self._query(np.ascontiguousarray(queries, dtype=np.float32)), k, threads=threads
        )
        keys = np.asarray(matches.keys, dtype=np.int64).reshape(len(queries), -1)
        distances = np.asarray(matches.distances, dtype=np.float32).reshape(len(queries), -1)
        counts = np.asarray(matches.counts, dtype=np.int64).reshape(-1)
        scores = ((1.0 - distances) * self._score_scale).astype(np.float32)
        return keys, scores, counts

    def search_many(
        self, queries: npt.NDArray[np.float32], k: int, *, threads: int = 0
    ) -> npt.NDArray[np.int64]:
        """Top ``k`` ids for each row of ``queries``; a row with fewer matches ends in ``-1``."""
        matches = self._index.search(  # type: ignore[attr-defined]
            self._query(np.ascontiguousarray(queries, dtype=np.float32)), k, threads=threads
        )
        keys = np.asarray(matches.keys, dtype=np.int64).reshape(len(queries), -1)
        counts = np.asarray(matches.counts).reshape(-1)
        for row, found in enumerate(counts):
            keys[row, int(found) :] = -1
        return keys
