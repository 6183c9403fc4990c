"""The self-tuner: measure which search a collection needs instead of guessing.

At build time :func:`tune` measures, on a sample of the collection's own vectors, exact
search's latency (when it is already fast, ``exact_fast_ms``, nothing is built), then builds
one graph (connectivity 16, expansion_add 64: enough for embeddings, ``bench/RESULTS.md``) and
raises ``expansion_search`` until recall@10 against exact search reaches the target. The graph
wins when it gets there faster than exact search; otherwise (random-like data, where a graph
needs a breadth near the whole set) exact search is kept.

Recall is measured on a sample of the index's own vectors held out of the graph while it is
measured (they join it afterwards): queries a graph has never seen, like real ones. A returned
item counts when its exact score reaches the true 10th score, so ties are not misses. The
result, a :class:`SearchPlan`, is recorded in the index's metadata and reported by ``stats``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.config import SearchConfig
from themis_clip.index.ann import HNSWIndex, choose_i8_stretch
from themis_clip.index.kernels import K, measure_exact_ms, rescore
from themis_clip.index.settings import SearchKind, SearchPlan

# SearchConfig and SearchPlan live in .settings; importable from here as before.
__all__ = ["SearchConfig", "SearchPlan", "tune"]

#: (connectivity, expansion_add) of the graph built: 1M embedding-like vectors reach recall@10
#: 0.98 on it at ~1 ms (bench/RESULTS.md).
GRAPH = (16, 64)
#: Fewer held-out queries than this measure nothing (collections under 50 vectors).
MIN_SAMPLE = 10
#: The breadths the tuner tries, in steps of ~1.25x where the usual targets land.
_EXPANSIONS: tuple[int, ...] = (16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)
_EXPANSIONS += (768, 1024, 1536, 2048, 4096)


def _truth(matrix: npt.NDArray[np.float32], rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
    """Each held-out sample row's true 10th-best score among the rows that are not held out."""
    kth = np.empty(len(rows), np.float32)
    k = min(K, len(matrix) - len(rows))
    for start in range(0, len(rows), 64):
        block = rows[start : start + 64]
        scores = matrix[block] @ matrix.T  # [b, n]
        scores[:, rows] = -np.inf  # the held-out rows are not in the graph being measured
        part = np.partition(-scores, k - 1, axis=1)[:, k - 1]
        kth[start : start + len(block)] = -part
    return kth


@dataclass
class _Sample:
    matrix: npt.NDArray[np.float32]
    ids: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int64]
    kth: npt.NDArray[np.float32]

    def recall(self, graph: HNSWIndex, fetch: int, *, threads: int) -> tuple[float, float]:
        """Mean recall@10 of the graph (with re-scoring of ``fetch`` candidates) and its
        standard error over the queries."""
        found = graph.search_many(self.matrix[self.rows], fetch, threads=threads)
        per_query = []
        want = min(K, len(self.ids) - len(self.rows))
        for i, row in enumerate(self.rows):
            cand = found[i][found[i] >= 0]
            pos = np.searchsorted(self.ids, cand)
            pos = pos[
                (pos < len(self.ids)) & (self.ids[np.minimum(pos, len(self.ids) - 1)] == cand)
            ]
            exact = self.matrix[pos[:fetch]] @ self.matrix[row]
            top = np.sort(exact)[::-1][:K]
            per_query.append(int(np.sum(top >= self.kth[i] - 1e-6)) / want if want else 1.0)
        values = np.asarray(per_query)
        return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values)))

    def latency(self, graph: HNSWIndex, fetch: int, *, queries: int = 60) -> tuple[float, float]:
        """p50/p99 ms of one query: graph search, then exact re-scoring of the candidates."""
        times = []
        rescoring = fetch > K
        for row in self.rows[:queries]:
            q = self.matrix[row]
            t0 = time.perf_counter()
            cand, _ = graph.search(q, fetch)
            if rescoring:
                pos = np.searchsorted(self.ids, cand)
                rescore(cand, self.matrix[np.minimum(pos, len(self.ids) - 1)], q, K)
            times.append((time.perf_counter() - t0) * 1000)
        return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def tune(
    ids: npt.NDArray[np.int64],
    matrix: npt.NDArray[np.float32],
    settings: SearchConfig,
    *,
    threads: int = 0,
    force_graph: bool = False,
    fixed: tuple[int, int] | None = None,
    fixed_expansion_search: int | None = None,
    progress: Callable[[str, int, int], object] | None = None,
) -> tuple[SearchPlan, HNSWIndex | None]:
    """Measure and choose how to search ``matrix`` (rows keyed by ascending ``ids``).

    Args:
        force_graph: build a graph even when exact search is cheaper (the index's fixed
            ``exact_threshold`` asked for one); the best breadth found is kept.
        fixed: (connectivity, expansion_add) given by the caller instead of :data:`GRAPH`.
        fixed_expansion_search: given by the caller: not swept, only measured.
        progress: ``(phase, done, total)`` while the graph is built.

    Returns:
        The plan and, when it chose a graph, the graph.
    """
    started = time.perf_counter()
    n = len(ids)
    if n == 0:  # an empty index (an empty folder): nothing to measure or to build
        return SearchPlan(
            kind=SearchKind.EXACT,
            reason="no items: exact search",
            tuning_s=0.0,
            items=0,
            exact_p50_ms=0.0,
            target_recall=settings.target_recall,
        ), None
    rng = np.random.default_rng(0)
    # Held out: at most a fifth of the collection, so the graph measured is nearly the real one.
    size = min(settings.sample, n // 5)
    rows = np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)
    exact_p50, _ = measure_exact_ms(matrix, matrix[rows] if size else matrix[:1])
    common: dict[str, Any] = {
        "items": n,
        "exact_p50_ms": exact_p50,
        "target_recall": settings.target_recall,
    }
    if not force_graph and exact_p50 <= settings.exact_fast_ms:
        return SearchPlan(
            kind=SearchKind.EXACT,
            reason=f"exact search takes {exact_p50:.2f} ms (<= {settings.exact_fast_ms} ms)",
            tuning_s=time.perf_counter() - started,
            **common,
        ), None
    if size < MIN_SAMPLE:  # too few vectors to measure anything: the cheapest graph
        connectivity, expansion_add = fixed or GRAPH
        graph = HNSWIndex.build(
            ids,
            matrix,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=fixed_expansion_search or 64,
            dtype=settings.graph_dtype,
            threads=threads,
        )
        return SearchPlan(
            kind=SearchKind.HNSW,
            reason=f"{n} vectors: too few to measure; the cheapest graph",
            dtype=settings.graph_dtype,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=graph.expansion_search,
            tuning_s=time.perf_counter() - started,
            **common,
        ), graph
    sample = _Sample(matrix=matrix, ids=ids, rows=rows, kth=_truth(matrix, rows))
    connectivity, expansion_add = fixed or GRAPH
    fetch = settings.fetch(K, settings.graph_dtype)
    t0 = time.perf_counter()
    graph = _build_without(
        ids,
        matrix,
        rows,
        connectivity=connectivity,
        expansion_add=expansion_add,
        dtype=settings.graph_dtype,
        threads=threads,
        progress=_phase(progress, f"graph (connectivity {connectivity})"),
    )
    step: dict[str, Any] = {
        "connectivity": connectivity,
        "expansion_add": expansion_add,
        "build_s": round(time.perf_counter() - t0, 2),
        "sweep": [],
    }
    if graph.i8_stretch is not None:
        step["i8_stretch"] = graph.i8_stretch
    chosen: dict[str, Any] | None = None
    best: dict[str, Any] | None = None  # the best recall seen, kept when a graph is forced
    sweep = (fixed_expansion_search,) if fixed_expansion_search else _EXPANSIONS
    for ef in sweep:
        if ef < fetch:
            continue
        graph.expansion_search = ef
        recall, error = sample.recall(graph, fetch, threads=threads)
        p50, p99 = sample.latency(graph, fetch)
        point = {
            "expansion_search": ef,
            "recall_at_10": round(recall, 4),
            "recall_se": round(error, 4),
            "p50_ms": p50,
        }
        step["sweep"].append(point)
        if best is None or recall > best["recall_at_10"]:
            best = {**point, "p99_ms": p99}
        # A setting that reaches the target only by the sample's luck is not taken: its
        # recall less one standard error over the queries must (1,000 queries: ~0.002).
        if recall - error >= settings.target_recall:
            chosen = {**point, "p99_ms": p99}
            break
        if p50 > exact_p50 and not force_graph:
            break  # a wider search only costs more
    if chosen is not None and not force_graph and chosen["p50_ms"] < exact_p50:
        # Exact search was timed once, at the start: time it again before a graph wins on
        # it, so that one busy moment then does not decide (the lower of the two counts).
        again, _ = measure_exact_ms(matrix, matrix[rows])
        exact_p50 = min(exact_p50, again)
        common["exact_p50_ms"] = exact_p50
    if chosen is not None and (force_graph or chosen["p50_ms"] < exact_p50):
        why = "reaches the target"
    elif force_graph and best is not None:
        chosen, why = best, "best found (target missed)"
    else:
        reached = max((p["recall_at_10"] for p in step["sweep"]), default=0.0)
        return SearchPlan(
            kind=SearchKind.EXACT,
            reason=(
                f"no graph reached recall@10 {settings.target_recall} faster than exact "
                f"search ({exact_p50:.2f} ms); best recall {reached:.3f}"
            ),
            tuning_s=time.perf_counter() - started,
            steps=[step],
            **common,
        ), None
    graph.add(ids[rows], matrix[rows], threads=threads)  # the held-out rows join
    return _graph_plan(common, settings, step, chosen, graph, started, why), graph


def _build_without(
    ids: npt.NDArray[np.int64],
    matrix: npt.NDArray[np.float32],
    rows: npt.NDArray[np.int64],
    *,
    progress: Callable[[int, int], object] | None,
    **graph: Any,
) -> HNSWIndex:
    """A graph of every row but the sorted held-out ``rows``, added segment by segment
    between them (no copy of the matrix)."""
    # The i8 scale from the whole matrix, not from the first segment's few rows.
    first = HNSWIndex.build(ids[:0], matrix[:0], i8_stretch=choose_i8_stretch(matrix), **graph)
    bounds = [-1, *rows.tolist(), len(ids)]
    done = 0
    total = len(ids) - len(rows)
    for a, b in itertools.pairwise(bounds):
        if b - a <= 1:
            continue
        first.add(
            ids[a + 1 : b],
            matrix[a + 1 : b],
            threads=graph["threads"],
            progress=_offset(progress, done, total),
        )
        done += b - a - 1
    return first


def _offset(
    progress: Callable[[int, int], object] | None, offset: int, total: int
) -> Callable[[int, int], object] | None:
    """``progress`` for one segment of a build, counted from ``offset`` of ``total``."""
    if progress is None:
        return None
    report = progress

    def callback(done: int, _segment: int) -> object:
        return report(offset + done, total)

    return callback


def _phase(
    progress: Callable[[str, int, int], object] | None, phase: str
) -> Callable[[int, int], object] | None:
    if progress is None:
        return None
    report = progress

    def callback(done: int, total: int) -> object:
        return report(phase, done, total)

    return callback


def _graph_plan(
    common: dict[str, Any],
    settings: SearchConfig,
    step: dict[str, Any],
    point: dict[str, Any],
    graph: HNSWIndex,
    started: float,
    why: str,
) -> SearchPlan:
    graph.expansion_search = int(point["expansion_search"])
    return SearchPlan(
        kind=SearchKind.HNSW,
        reason=(
            f"connectivity {step['connectivity']}, expansion_search {point['expansion_search']} "
            f"{why}: recall@10 {point['recall_at_10']:.3f} in {point['p50_ms']:.2f} ms "
            f"(exact {common['exact_p50_ms']:.2f} ms)"
        ),
        dtype=settings.graph_dtype,
        connectivity=step["connectivity"],
        expansion_add=step["expansion_add"],
        expansion_search=int(point["expansion_search"]),
        recall_at_10=float(point["recall_at_10"]),
        p50_ms=float(point["p50_ms"]),
        p99_ms=float(point.get("p99_ms", point["p50_ms"])),
        graph_bytes_per_item=graph.serialized_bytes / max(1, len(graph)),
        tuning_s=time.perf_counter() - started,
        steps=[step],
        **common,
    )
