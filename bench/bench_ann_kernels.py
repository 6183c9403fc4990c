"""The graph libraries' search kernels side by side: usearch (each metric and vector type our
graph can use) and hnswlib, same 100k embedding-like vectors, same degree (16) and breadth
(ef 64), one query at a time on one thread, k 10. Isolates the kernel from our store.

Run: .venv/bin/python bench/bench_ann_kernels.py   (hnswlib: the bench extra)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.embedding_data import clustered_rows


def per_query_ms(fn: Callable[[np.ndarray], object], queries: np.ndarray) -> float:
    for q in queries[:50]:
        fn(q)
    t0 = time.perf_counter()
    for q in queries:
        fn(q)
    return (time.perf_counter() - t0) / len(queries) * 1000


def main() -> None:
    import hnswlib
    from usearch.index import Index

    rng = np.random.default_rng(0)
    both = clustered_rows(rng, 100_500, 512)
    data, queries = both[:100_000], both[100_000:]
    for dtype, metric in [
        ("f32", "ip"),
        ("f32", "cos"),
        ("f16", "ip"),
        ("f16", "cos"),
        ("i8", "cos"),
    ]:
        index = Index(ndim=512, metric=metric, dtype=dtype, connectivity=16, expansion_add=64)
        t0 = time.perf_counter()
        index.add(np.arange(len(data), dtype=np.uint64), data, threads=2)
        build = time.perf_counter() - t0
        index.expansion_search = 64
        ms = per_query_ms(lambda q, ix=index: ix.search(q, 10, threads=1), queries)
        print(f"usearch {dtype} {metric:3s}: build {build:4.0f} s, search {ms:.3f} ms")
    h = hnswlib.Index(space="ip", dim=512)
    h.init_index(max_elements=len(data), M=16, ef_construction=64)
    t0 = time.perf_counter()
    h.add_items(data, np.arange(len(data)), num_threads=2)
    build = time.perf_counter() - t0
    h.set_ef(64)
    h.set_num_threads(1)
    ms = per_query_ms(lambda q: h.knn_query(q, k=10), queries)
    print(f"hnswlib f32 ip : build {build:4.0f} s, search {ms:.3f} ms")


if __name__ == "__main__":
    main()
