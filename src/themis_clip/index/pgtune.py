"""Measuring pgvector's HNSW index as :mod:`.tuning` measures ours: the smallest
``hnsw.ef_search`` whose recall@10 against an exact scan reaches the target.

Recall is measured on stored vectors used as queries, each left out of its own results, and a
returned item counts when its score reaches the true 10th score (ties are not misses). The
result is the same plan record as :class:`~.tuning.SearchPlan` (``kind`` ``"pgvector"``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from themis_clip.index.pgstore import PgStore
    from themis_clip.index.tuning import GraphSettings

__all__ = ["EF_SWEEP", "measure_ef_search"]

#: ``hnsw.ef_search`` values tried, cheapest first (pgvector's largest is 1000).
EF_SWEEP = (40, 64, 100, 160, 250, 400, 640, 1000)
#: Queries per measurement: each exact one is a full scan of the table.
SAMPLE = 60


def measure_ef_search(store: PgStore, settings: GraphSettings, count: int) -> dict[str, Any]:
    """Recall@10 and latency of the HNSW index per ``ef_search``; the plan as a dict."""
    started = time.perf_counter()
    queries = store.sample(min(settings.sample, SAMPLE, count))
    truth, exact_ms = [], []
    for qid, q in queries:
        t0 = time.perf_counter()
        ids, scores = store.exact_nearest(q, 11)
        exact_ms.append((time.perf_counter() - t0) * 1000)
        best = [float(s) for i, s in zip(ids, scores, strict=True) if i != qid][:10]
        truth.append(best[-1] if best else 1.0)
    exact_p50 = float(np.percentile(exact_ms, 50))
    want = min(10, count - 1)
    sweep: list[dict[str, Any]] = []
    chosen: dict[str, Any] | None = None
    for ef in EF_SWEEP:
        hits, total, times = 0, 0, []
        for (qid, q), kth in zip(queries, truth, strict=True):
            t0 = time.perf_counter()
            ids, scores = store.nearest(q, 11, None, expansion_search=ef)
            times.append((time.perf_counter() - t0) * 1000)
            got = [float(s) for i, s in zip(ids, scores, strict=True) if i != qid][:10]
            hits += sum(1 for s in got if s >= kth - 1e-5)
            total += want
        recall = hits / total if total else 1.0
        point = {
            "expansion_search": ef,
            "recall_at_10": round(recall, 4),
            "p50_ms": float(np.percentile(times, 50)),
            "p99_ms": float(np.percentile(times, 99)),
        }
        sweep.append(point)
        if recall >= settings.target_recall:
            chosen = point
            break
    chosen = chosen or max(sweep, key=lambda p: p["recall_at_10"])
    met = chosen["recall_at_10"] >= settings.target_recall
    kind = "halfvec" if store.halfvec else "vector"
    return {
        "kind": "pgvector",
        "items": count,
        "reason": (
            f"pgvector HNSW (m 16, {kind}), ef_search {chosen['expansion_search']}: recall@10 "
            f"{chosen['recall_at_10']:.3f} in {chosen['p50_ms']:.2f} ms (exact scan "
            f"{exact_p50:.2f} ms)" + ("" if met else "; target not reached")
        ),
        "exact_p50_ms": exact_p50,
        "dtype": "f16" if store.halfvec else "f32",
        "connectivity": 16,
        "expansion_add": 64,
        "expansion_search": chosen["expansion_search"],
        "recall_at_10": chosen["recall_at_10"],
        "p50_ms": chosen["p50_ms"],
        "p99_ms": chosen["p99_ms"],
        "graph_bytes_per_item": store.hnsw_bytes() / count,
        "target_recall": settings.target_recall,
        "tuning_s": time.perf_counter() - started,
        "steps": [{"connectivity": 16, "expansion_add": 64, "sweep": sweep}],
    }
