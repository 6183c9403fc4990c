"""Search quality and latency: HNSW (usearch) vs exact numpy at 100k 512-d vectors.

``--data random`` (default): random unit vectors, the hard case for graph search (no cluster
structure). ``--data clustered``: vectors shaped like image embeddings (``bench/embedding_data.py``:
clusters in a low-dimensional subspace; queries are held-out draws). Items go
through the real store (SQLite, one transaction per 10k) and the real VectorIndex, so query
latency includes fetching the hits' rows. Recall@10 is measured against brute force, for
several ``expansion_search`` values on one saved graph (connectivity 32, expansion_add 128).

Run: .venv/bin/python bench/bench_search.py [--data clustered] [--n 100000] [--dim 512]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from themis_clip.index.search import ModelStamp, VectorIndex, top_k
from themis_clip.index.store import ItemRow

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.embedding_data import clustered_rows, intrinsic_dimension, random_rows


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    return random_rows(rng, n, dim)


def demo_intrinsic_dimension() -> float:
    """TwoNN estimate of the shipped demo model's embeddings of 2,000 generated scenes."""
    from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
    from themis_clip.demo.scenes import random_scene, render_scene

    rng = np.random.default_rng(1)
    images = [np.asarray(render_scene(random_scene(rng), size=64)) for _ in range(2000)]
    plugin = OnnxClipPlugin()
    assert plugin.initialize(PluginConfig.from_dict({"model": {"path": str(demo_model_path())}}))
    vectors = np.stack([r.embedding for r in plugin.generate_embedding_batch(images)])
    return intrinsic_dimension(vectors.astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", choices=["random", "clustered"], default="random")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--connectivity", type=int, default=64)
    parser.add_argument("--expansion-add", type=int, default=256)
    parser.add_argument("--sweep", default="512,1024,2048,4096")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    if args.data == "clustered":  # one draw, split: queries are held out, never indexed
        both = clustered_rows(rng, args.n + args.queries, args.dim)
        data, queries = both[: args.n], both[args.n :]
        print(
            f"intrinsic dimension (TwoNN): generated {intrinsic_dimension(data):.1f}, "
            f"demo model over 2,000 scenes {demo_intrinsic_dimension():.1f}"
        )
    else:
        data = unit_rows(rng, args.n, args.dim)
        queries = unit_rows(rng, args.queries, args.dim)
    truth = [set(top_k(data, q, 10)[0].tolist()) for q in queries]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        t0 = time.perf_counter()
        with VectorIndex(
            path,
            exact_threshold=10_000,
            connectivity=args.connectivity,
            expansion_add=args.expansion_add,
        ) as index:
            index.bind_model(ModelStamp(model_id="bench@0", sha256="0" * 64, dim=args.dim))
            for start in range(0, args.n, 10_000):
                rows = [
                    ItemRow(key=str(i), vector=data[i])
                    for i in range(start, min(start + 10_000, args.n))
                ]
                index.store.upsert(rows, dim=args.dim)
            insert_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            index.search(queries[0], 10)  # builds and saves the graph
            build_s = time.perf_counter() - t0
            assert index.mode == "hnsw"
        sweep = {}
        open_ms = 0.0
        for es in (int(x) for x in args.sweep.split(",")):
            with VectorIndex(
                path, readonly=True, expansion_search=es, exact_threshold=10_000
            ) as ro:  # memory-mapped graph
                t0 = time.perf_counter()
                ro.search(queries[0], 10)
                open_ms = max(open_ms, (time.perf_counter() - t0) * 1000)
                recalls, ms = [], []
                for q, t in zip(queries, truth, strict=True):
                    t1 = time.perf_counter()
                    hits = ro.search(q, 10)
                    ms.append((time.perf_counter() - t1) * 1000)
                    recalls.append(len(t & {int(h.key) for h in hits}) / 10)
                sweep[es] = {
                    "recall_at_10": float(np.mean(recalls)),
                    "p50_ms": float(np.percentile(ms, 50)),
                    "p99_ms": float(np.percentile(ms, 99)),
                }
    exact_ms = []
    for q in queries:
        t1 = time.perf_counter()
        top_k(data, q, 10)
        exact_ms.append((time.perf_counter() - t1) * 1000)
    result = {
        "n": args.n,
        "dim": args.dim,
        "queries": args.queries,
        "sweep": sweep,
        "exact_p50_ms": float(np.percentile(exact_ms, 50)),
        "exact_p99_ms": float(np.percentile(exact_ms, 99)),
        "insert_s": insert_s,
        "graph_build_s": build_s,
        "readonly_open_first_query_ms": open_ms,
    }
    print(
        f"{args.n} x {args.dim}-d {args.data} unit vectors, {args.queries} queries, "
        f"connectivity {args.connectivity}, expansion_add {args.expansion_add}"
    )
    for es, r in sweep.items():
        print(
            f"  HNSW expansion_search {es:5d}: recall@10 {r['recall_at_10']:.4f}, "
            f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"
        )
    print(
        f"  exact numpy:                 recall@10 1.0000, p50 {result['exact_p50_ms']:.2f} ms, "
        f"p99 {result['exact_p99_ms']:.2f} ms"
    )
    print(
        f"insert {insert_s:.1f} s, graph build {build_s:.0f} s, read-only open + first query "
        f"{open_ms:.0f} ms (memory-mapped graph)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
