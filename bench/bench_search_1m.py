"""Issue 30, item 4: search at 1M x 512 through ``VectorIndex`` against bare hnswlib, one run.

Measures, on the same embedding-like vectors (``bench/embedding_data.py`` clustered, seed 0)
and the same held-out queries (never indexed; recall@10 against brute force):

* ours through ``VectorIndex.search`` (read-only open, memory-mapped graph and vectors file, as
  ``themis-clip search`` runs): p50 / p95 / p99 and recall@10 at the tuner's breadth, and a
  sweep of breadths (``expansion_search``) for latency at equal recall;
* ``VectorIndex.search_many`` over all the queries at once: wall time per query, recall;
* where a query's time goes (a per-stage timer over the same queries: the graph, the candidates'
  float32 rows from the vectors file and their re-scoring, the hits' SQLite records, the rest),
  and a cProfile of the searches;
* bare hnswlib (M 16, efConstruction 64 unless told, float32; built once per work dir and
  saved there), its breadths swept interleaved with ours; our p50 divided by hnswlib's p50 at
  our recall (its cheapest breadth reaching it, interpolated with the breadth before).

The build is the heavy part, so it is a phase of its own (``--phase build``: the vectors, the
SQLite index and our graph, tuned as ``themis-clip index`` does, into ``--workdir``), and
``--phase measure`` reuses it (run each under ``flock /tmp/themis-bench.lock``). Prints one JSON
line per result and appends them to ``--out``.

Run: .venv/bin/python bench/bench_search_1m.py --phase build --workdir /tmp/s1m/w1m
     .venv/bin/python bench/bench_search_1m.py --phase measure --workdir /tmp/s1m/w1m
hnswlib is a benchmark-only peer: ``pip install hnswlib``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_search import fill, truth_sets
from bench.embedding_data import clustered_rows

from themis_clip.index.kernels import rescore
from themis_clip.index.search import GRAPH_SUFFIX, VectorIndex
from themis_clip.index.vectors import VECTORS_SUFFIX

TARGET = 0.98
OUR_EF = [128, 160, 192, 256, 320, 384, 448, 512]
PEER_EF = [64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640, 768]


def emit(out: Path, result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)
    with open(out, "a") as f:
        f.write(json.dumps(result) + "\n")


def recall_of(found: list[list[int]], truth: list[set[int]]) -> float:
    return float(np.mean([len(t & set(f[:10])) / 10 for f, t in zip(found, truth, strict=True)]))


def timed(search: Any, queries: np.ndarray, truth: list[set[int]]) -> dict[str, float]:
    for q in queries[:20]:  # warm
        search(q)
    ms, found = [], []
    for q in queries:
        t0 = time.perf_counter()
        got = search(q)
        ms.append((time.perf_counter() - t0) * 1000)
        found.append(got)
    return {
        "recall_at_10": recall_of(found, truth),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def at_recall(points: list[dict[str, Any]], recall: float) -> float | None:
    """A sweep's p50 at ``recall``: its cheapest breadth reaching it, interpolated with the
    breadth before (points in breadth order; None: the sweep never reaches it)."""
    for i, hi in enumerate(points):
        if hi["recall_at_10"] < recall:
            continue
        if i == 0:
            return float(hi["p50_ms"])
        lo = points[i - 1]
        span = hi["recall_at_10"] - lo["recall_at_10"]
        w = 1.0 if span <= 0 else (recall - lo["recall_at_10"]) / span
        return float(lo["p50_ms"] + w * (hi["p50_ms"] - lo["p50_ms"]))
    return None


def phase_build(args: argparse.Namespace, work: Path) -> None:
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    both = clustered_rows(rng, args.n + args.queries, args.dim)
    np.save(work / "data.npy", both[: args.n])
    np.save(work / "queries.npy", both[args.n :])  # held out: never indexed
    data = both[: args.n]
    print(f"vectors: {time.perf_counter() - t0:.0f} s", flush=True)
    db = work / "bench.db"
    for f in VectorIndex.files(db):
        f.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with VectorIndex(db) as index:
        fill(index, data, 10_000)
    insert_s = time.perf_counter() - t0
    print(f"SQLite insert: {insert_s:.0f} s", flush=True)
    with VectorIndex(db) as index:  # tuned and built as `themis-clip index` does
        t0 = time.perf_counter()
        assert index.prepare_graph()
        build_s = time.perf_counter() - t0
        plan = index.plan
        assert plan is not None
    graph = Path(str(db) + GRAPH_SUFFIX)
    vectors = Path(str(db) + VECTORS_SUFFIX)
    emit(
        args.out,
        {
            "part": "ours-build",
            "n": args.n,
            "dim": args.dim,
            "insert_s": insert_s,
            "build_s": build_s,
            "plan": {k: v for k, v in plan.to_dict().items() if k != "steps"},
            "steps": plan.steps,
            "graph_bytes_per_item": graph.stat().st_size / args.n,
            "vectors_bytes_per_item": vectors.stat().st_size / args.n,
        },
    )


def stages(ro: VectorIndex, queries: np.ndarray, k: int = 10) -> dict[str, float]:
    """Milliseconds a query spends in each stage of ``VectorIndex.search``'s path (the same
    calls, timed one by one), mean and median, and the rest (locks, checks, hits)."""
    searcher = ro.searcher
    structures = searcher._structures()  # type: ignore[attr-defined]
    ann = structures.ann
    fetch = ro.settings.fetch(k, ann.dtype)
    dim = queries.shape[1]
    parts: dict[str, list[float]] = {"graph": [], "rows": [], "rescore": [], "records": []}
    totals = []
    for q in queries:  # the stages' calls one by one (one pass: no query repeated hot)
        t1 = time.perf_counter()
        ids, _ = ann.search(q, fetch)
        t2 = time.perf_counter()
        vectors = structures.vectors_of(ids, dim)
        t3 = time.perf_counter()
        top, _scores = rescore(ids, vectors, q, k)
        t4 = time.perf_counter()
        ro.store.items_by_id([int(i) for i in top])
        t5 = time.perf_counter()
        for name, a, b in (
            ("graph", t1, t2),
            ("rows", t2, t3),
            ("rescore", t3, t4),
            ("records", t4, t5),
        ):
            parts[name].append((b - a) * 1000)
    for q in queries:  # then the whole, in a pass of its own
        t0 = time.perf_counter()
        ro.search(q, k)
        totals.append((time.perf_counter() - t0) * 1000)
    # Means add up (medians do not): the rest is the whole's mean less the stages' means.
    out = {f"{name}_mean_ms": float(np.mean(v)) for name, v in parts.items()}
    out.update({f"{name}_p50_ms": float(np.median(v)) for name, v in parts.items()})
    out["whole_mean_ms"] = float(np.mean(totals))
    out["whole_p50_ms"] = float(np.median(totals))
    out["rest_mean_ms"] = out["whole_mean_ms"] - sum(out[f"{n}_mean_ms"] for n in parts)
    return out


def profile(ro: VectorIndex, queries: np.ndarray) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for q in queries:
        ro.search(q, 10)
    pr.disable()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(14)
    return text.getvalue()


def hnswlib_index(data: np.ndarray, work: Path, efc: int) -> tuple[Any, float]:
    """Bare hnswlib (M 16, float32) over ``data``: built once per work dir and saved there,
    loaded by later runs; ``(index, build seconds of the run that built it)``."""
    import hnswlib

    saved = work / f"hnswlib-M16-efc{efc}.bin"
    meta = saved.with_suffix(".json")
    index = hnswlib.Index(space="ip", dim=data.shape[1])
    if saved.is_file() and meta.is_file():
        index.load_index(str(saved), max_elements=len(data))
        return index, float(json.loads(meta.read_text())["build_s"])
    index.init_index(max_elements=len(data), M=16, ef_construction=efc)
    t0 = time.perf_counter()
    for start in range(0, len(data), 100_000):
        chunk = np.asarray(data[start : start + 100_000])
        index.add_items(
            chunk, np.arange(start, start + len(chunk)), num_threads=os.cpu_count() or 2
        )
    build_s = time.perf_counter() - t0
    index.save_index(str(saved))
    meta.write_text(json.dumps({"build_s": build_s}))
    return index, build_s


def phase_measure(args: argparse.Namespace, work: Path) -> None:
    data = np.load(work / "data.npy", mmap_mode="r")
    queries = np.load(work / "queries.npy")[: args.queries]
    t0 = time.perf_counter()
    truth = truth_sets(np.asarray(data), queries)
    print(f"brute force truth: {time.perf_counter() - t0:.0f} s", flush=True)
    index, build_s = hnswlib_index(data, work, args.peer_efc)
    index.set_num_threads(1)
    print(f"hnswlib: built in {build_s:.0f} s", flush=True)

    def peer(q: np.ndarray) -> list[int]:
        return index.knn_query(q, k=10)[0][0].tolist()  # type: ignore[no-any-return]

    db = work / "bench.db"
    result: dict[str, Any] = {
        "part": "ours-vs-hnswlib",
        "n": len(data),
        "queries": len(queries),
        "hnswlib_build_s": build_s,
        "hnswlib": {"M": 16, "ef_construction": args.peer_efc},
        "load_average_before": os.getloadavg(),
    }
    with VectorIndex(db, readonly=True) as ro:  # as `themis-clip search` opens it
        assert ro.mode == "hnsw"
        ro.search(queries[0], 10)
        result["graph"] = ro.stats()["graph"]
        ann = ro.searcher._ann  # type: ignore[attr-defined]
        tuned = ann.expansion_search

        def ours(q: np.ndarray) -> list[int]:
            return [int(h.key) for h in ro.search(q, 10)]

        for q in queries:  # page the graph, the vectors file and the hits' rows in
            ours(q)
            peer(q)
        result["through_vector_index"] = {"expansion_search": tuned, **timed(ours, queries, truth)}
        print("ours, tuned:", result["through_vector_index"], flush=True)
        result["stages"] = stages(ro, queries)
        print("stages:", result["stages"], flush=True)
        t0 = time.perf_counter()
        many = ro.search_many(queries, 10)
        wall = time.perf_counter() - t0
        result["search_many"] = {
            "per_query_ms": wall * 1000 / len(queries),
            "recall_at_10": recall_of([[int(h.key) for h in hits] for hits in many], truth),
            "threads": os.cpu_count(),
        }
        print("search_many:", result["search_many"], flush=True)
        # The two sweeps interleaved breadth by breadth: drift hits both alike.
        sweep, peer_sweep = [], []
        for ef in sorted(set(OUR_EF) | set(PEER_EF)):
            if ef in OUR_EF:
                ann.expansion_search = ef
                point = {"expansion_search": ef, **timed(ours, queries, truth)}
                sweep.append(point)
                print(f"  ours ef {ef}: {point}", flush=True)
            if ef in PEER_EF:
                index.set_ef(ef)
                point = {"ef": ef, **timed(peer, queries, truth)}
                peer_sweep.append(point)
                print(f"  hnswlib ef {ef}: {point}", flush=True)
        result["our_sweep"], result["hnswlib_sweep"] = sweep, peer_sweep
        ann.expansion_search = tuned
        result["through_vector_index_again"] = timed(ours, queries, truth)
        print("ours again:", result["through_vector_index_again"], flush=True)
        result["profile"] = profile(ro, queries)
        print(result["profile"], flush=True)
    result["load_average_after"] = os.getloadavg()
    ratios = []
    for point in [result["through_vector_index"], *sweep]:
        peer_ms = at_recall(peer_sweep, point["recall_at_10"])
        ratios.append(
            {
                "our_recall": point["recall_at_10"],
                "our_p50_ms": point["p50_ms"],
                "hnswlib_p50_ms_at_that_recall": peer_ms,
                "ratio": None if peer_ms is None else point["p50_ms"] / peer_ms,
            }
        )
    result["ratios"] = ratios
    for r in ratios:
        print(
            f"  recall {r['our_recall']:.4f}: ours {r['our_p50_ms']:.3f} ms, hnswlib "
            f"{r['hnswlib_p50_ms_at_that_recall']} ms, ratio {r['ratio']}",
            flush=True,
        )
    emit(args.out, {k: v for k, v in result.items() if k != "profile"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=["build", "measure", "all"], default="all")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/themis-search-1m"))
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--peer-efc", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/search-results-1m.jsonl"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.phase in ("build", "all"):
        phase_build(args, args.workdir)
    if args.phase in ("measure", "all"):
        phase_measure(args, args.workdir)


if __name__ == "__main__":
    main()
