"""Search quality and latency: HNSW (usearch) vs exact numpy at 100k random 512-d vectors.

Random unit vectors are the hard case for graph search (no cluster structure). Items go
through the real store (SQLite, one transaction per 10k) and the real VectorIndex, so query
latency includes fetching the hits' rows. Recall@10 is measured against brute force.

Run: .venv/bin/python bench/bench_search.py [--n 100000] [--dim 512] [--queries 500]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from themis_clip.index.search import ModelStamp, VectorIndex, top_k
from themis_clip.index.store import ItemRow


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=500)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    data = unit_rows(rng, args.n, args.dim)
    queries = unit_rows(rng, args.queries, args.dim)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        t0 = time.perf_counter()
        with VectorIndex(path) as index:
            index.bind_model(ModelStamp(model_id="bench@0", sha256="0" * 64, dim=args.dim))
            for start in range(0, args.n, 10_000):
                index.store.upsert(
                    [
                        ItemRow(key=str(i), vector=data[i])
                        for i in range(start, min(start + 10_000, args.n))
                    ],
                    dim=args.dim,
                )
            insert_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            index.search(queries[0], 10)  # builds and saves the graph
            build_s = time.perf_counter() - t0
            assert index.mode == "hnsw"
            recalls, hnsw_ms = [], []
            for q in queries:
                t = time.perf_counter()
                hits = index.search(q, 10)
                hnsw_ms.append((time.perf_counter() - t) * 1000)
                truth = set(top_k(data, q, 10)[0].tolist())
                recalls.append(len(truth & {int(h.key) for h in hits}) / 10)
            exact_ms = []
            for q in queries[:100]:
                t = time.perf_counter()
                top_k(data, q, 10)
                exact_ms.append((time.perf_counter() - t) * 1000)
        with VectorIndex(path, readonly=True) as ro:
            t0 = time.perf_counter()
            ro.search(queries[0], 10)
            open_ms = (time.perf_counter() - t0) * 1000
    recall = float(np.mean(recalls))
    result = {
        "n": args.n,
        "dim": args.dim,
        "queries": args.queries,
        "recall_at_10": recall,
        "hnsw_p50_ms": float(np.percentile(hnsw_ms, 50)),
        "hnsw_p99_ms": float(np.percentile(hnsw_ms, 99)),
        "exact_p50_ms": float(np.percentile(exact_ms, 50)),
        "exact_p99_ms": float(np.percentile(exact_ms, 99)),
        "insert_s": insert_s,
        "graph_build_s": build_s,
        "readonly_first_query_ms": open_ms,
    }
    print(f"{args.n} x {args.dim}-d random unit vectors, {args.queries} queries")
    print(f"recall@10 (HNSW vs brute force): {recall:.4f}")
    print(
        f"query latency p50/p99: HNSW {result['hnsw_p50_ms']:.2f}/{result['hnsw_p99_ms']:.2f} ms, "
        f"exact numpy {result['exact_p50_ms']:.2f}/{result['exact_p99_ms']:.2f} ms "
        f"(x{result['exact_p50_ms'] / result['hnsw_p50_ms']:.1f} at p50)"
    )
    print(
        f"insert {insert_s:.1f} s, graph build {build_s:.1f} s, read-only open + first query {open_ms:.0f} ms "
        "(memory-mapped graph)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
