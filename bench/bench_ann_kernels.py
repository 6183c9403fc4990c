"""The graph libraries' search kernels side by side: usearch (each metric and vector type our
graph can use, and our own i8 graph, whose codes are stretched to the components' range) and
hnswlib, same embedding-like vectors, same degree (16), one query at a time
on one thread, k 10. usearch compact graphs fetch 30 candidates re-scored from float32 (as
``VectorIndex`` does); recall@10 against brute force on held-out queries. Isolates the kernel
from our store.

Run: .venv/bin/python bench/bench_ann_kernels.py [--n 100000] [--dim 512] [--ef 48,64]
[--kinds ours-i8,hnswlib] (hnswlib: the bench extra). With both ``ours-i8`` and ``hnswlib`` it
also times the two query by query, alternating, which is the fair ratio on a noisy machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.embedding_data import clustered_rows

from themis_clip.index.ann import HNSWIndex


def run(
    fn: Callable[[np.ndarray], np.ndarray], queries: np.ndarray, truth: np.ndarray
) -> tuple[float, float]:
    """(recall@10, ms per query)."""
    for q in queries[:50]:
        fn(q)
    t0 = time.perf_counter()
    got = [fn(q) for q in queries]
    ms = (time.perf_counter() - t0) / len(queries) * 1000
    recall = np.mean(
        [len(set(g.tolist()) & set(t.tolist())) / 10 for g, t in zip(got, truth, strict=True)]
    )
    return float(recall), ms


USEARCH = ["f32-ip", "f16-ip", "f16-cos", "i8-cos", "i8-ip"]


def head_to_head(
    fns: dict[str, Callable[[np.ndarray], np.ndarray]], queries: np.ndarray, truth: np.ndarray
) -> dict[str, tuple[float, float]]:
    """Each query on every index in turn, the order rotating, so the machine's drift (these
    2-core machines are noisy) falls on all alike: {name: (recall@10, p50 ms)}."""
    names = list(fns)
    for q in queries[:50]:
        for name in names:
            fns[name](q)
    times: dict[str, list[float]] = {name: [] for name in names}
    got: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for number, q in enumerate(queries):
        for name in names[number % len(names) :] + names[: number % len(names)]:
            t0 = time.perf_counter()
            got[name].append(fns[name](q))
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name in names:
        recall = np.mean(
            [
                len(set(g.tolist()) & set(t.tolist())) / 10
                for g, t in zip(got[name], truth, strict=True)
            ]
        )
        out[name] = (float(recall), float(np.median(times[name])) * 1000)
    return out


def main() -> None:
    import hnswlib
    from usearch.index import Index

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--ef", default="48,64")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument(
        "--kinds",
        default=",".join([*USEARCH, "ours-i8", "hnswlib"]),
        help="usearch's own (f32-ip, ..., i8-ip), ours-i8 (our stretched codes), hnswlib; "
        "ours-i8 and hnswlib together are also timed head to head, query by query",
    )
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    breadths = [int(v) for v in args.ef.split(",")]
    rng = np.random.default_rng(0)
    both = clustered_rows(rng, args.n + args.queries, args.dim)
    data, queries = both[: args.n], both[args.n :]
    truth = np.argsort(-(queries @ data.T), axis=1)[:, :10]

    def rescored(keys: np.ndarray, q: np.ndarray) -> np.ndarray:
        return keys[np.argsort(-(data[keys] @ q))[:10]]

    for kind in [k for k in USEARCH if k in kinds]:
        dtype, metric = kind.split("-")
        index = Index(ndim=args.dim, metric=metric, dtype=dtype, connectivity=16, expansion_add=64)
        t0 = time.perf_counter()
        index.add(np.arange(len(data), dtype=np.uint64), data, threads=2)
        build = time.perf_counter() - t0
        fetch = 10 if dtype == "f32" else 30
        for ef in breadths:
            index.expansion_search = ef

            def search(q: np.ndarray, ix: Index = index, fetch: int = fetch) -> np.ndarray:
                keys = ix.search(q, fetch, threads=1).keys.astype(np.int64)
                return keys if fetch == 10 else rescored(keys, q)

            recall, ms = run(search, queries, truth)
            print(
                f"usearch {dtype} {metric:3s}: build {build:4.0f} s, ef {ef:3d}: "
                f"recall {recall:.4f}, {ms:.3f} ms",
                flush=True,
            )
    ours = h = None
    if "ours-i8" in kinds:  # codes stretched to the components' range (HNSWIndex), same degree
        t0 = time.perf_counter()
        ours = HNSWIndex.build(
            np.arange(len(data), dtype=np.int64), data, dtype="i8", connectivity=16, threads=2
        )
        build = time.perf_counter() - t0
        for ef in breadths:
            ours.expansion_search = ef
            recall, ms = run(lambda q: rescored(ours.search(q, 30)[0], q), queries, truth)
            print(
                f"ours i8 ip x{ours.i8_stretch:.2f}: build {build:4.0f} s, ef {ef:3d}: "
                f"recall {recall:.4f}, {ms:.3f} ms",
                flush=True,
            )
    if "hnswlib" in kinds:
        h = hnswlib.Index(space="ip", dim=args.dim)
        h.init_index(max_elements=len(data), M=16, ef_construction=64)
        t0 = time.perf_counter()
        h.add_items(data, np.arange(len(data)), num_threads=2)
        build = time.perf_counter() - t0
        h.set_num_threads(1)
        for ef in breadths:
            h.set_ef(ef)
            recall, ms = run(lambda q: h.knn_query(q, k=10)[0][0].astype(np.int64), queries, truth)
            print(
                f"hnswlib f32 ip : build {build:4.0f} s, ef {ef:3d}: recall {recall:.4f}, {ms:.3f} ms",
                flush=True,
            )
    if ours is not None and h is not None:
        print("head to head (query by query, order rotating): recall / p50")
        for ef in breadths:
            ours.expansion_search = ef
            h.set_ef(ef)
            r = head_to_head(
                {
                    "ours-i8": lambda q: rescored(ours.search(q, 30)[0], q),
                    "hnswlib": lambda q: h.knn_query(q, k=10)[0][0].astype(np.int64),
                },
                queries,
                truth,
            )
            (ro, to), (rh, th) = r["ours-i8"], r["hnswlib"]
            print(
                f"  ef {ef:3d}: ours i8 {ro:.4f} / {to:.3f} ms, hnswlib {rh:.4f} / {th:.3f} ms: "
                f"{to / th:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
