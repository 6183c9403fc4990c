"""Exact-search kernels in numpy: top-k, re-scoring of candidates, and timing an exact query.

A leaf module (numpy only): the searchers and the tuner use these, and import nothing back.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

__all__ = ["K", "measure_exact_ms", "rescore", "top_k", "top_k_many"]

#: The k that recall and latency are measured at (recall@10).
K = 10


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


def top_k_many(
    matrix: npt.NDArray[np.float32], queries: npt.NDArray[np.float32], k: int
) -> tuple[list[npt.NDArray[np.int64]], list[npt.NDArray[np.float32]]]:
    """:func:`top_k` for each row of ``queries``, a block of them per matrix product (one pass
    over ``matrix`` serves the block; the scores block stays within ~128 MB)."""
    rows_out: list[npt.NDArray[np.int64]] = []
    scores_out: list[npt.NDArray[np.float32]] = []
    if not len(matrix):
        empty = (np.empty(0, np.int64), np.empty(0, np.float32))
        return [empty[0]] * len(queries), [empty[1]] * len(queries)
    block = max(1, (1 << 25) // max(1, len(matrix)))
    for start in range(0, len(queries), block):
        scores = queries[start : start + block] @ matrix.T
        for row in scores:
            kk = min(k, len(row))
            if kk <= 0:
                rows_out.append(np.empty(0, np.int64))
                scores_out.append(np.empty(0, np.float32))
                continue
            part = np.argpartition(-row, kk - 1)[:kk]
            order = part[np.argsort(-row[part], kind="stable")]
            rows_out.append(order.astype(np.int64))
            scores_out.append(row[order].astype(np.float32))
    return rows_out, scores_out


def rescore(
    ids: npt.NDArray[np.int64],
    vectors: npt.NDArray[np.float32],
    query: npt.NDArray[np.float32],
    k: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The top ``k`` of candidate ``ids`` by exact score against their float32 ``vectors``."""
    scores = vectors @ query
    order = np.argsort(-scores, kind="stable")[:k]
    return ids[order], scores[order].astype(np.float32)


def measure_exact_ms(
    matrix: npt.NDArray[np.float32], queries: npt.NDArray[np.float32], *, repeats: int = 15
) -> tuple[float, float]:
    """p50 and p99 milliseconds of one exact top-10 query over ``matrix``."""
    times = []
    for q in queries[: max(1, repeats)]:
        t0 = time.perf_counter()
        top_k(matrix, q, K)
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))
