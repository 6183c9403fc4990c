"""pgvector's ``ef_search`` rule against held-out queries.

In one run: embedding-like vectors (``bench/embedding_data.py``'s clustered generator, as
``bench/bench_search.py --data clustered``) go into a PostgreSQL store on one of the tests'
servers (``tests/pg.py``), ``prepare_graph`` builds pgvector's HNSW index and records the rule's
``ef_search`` (:func:`themis_clip.index.searchers.postgres.ef_search_for`), then ``--queries``
held-out draws of the same distribution (never stored) are searched at each ``ef_search`` of a
sweep, cheapest first, up to the larger of the rule's setting and the first that reaches the
target on them. Recall@10 counts a returned item when its score reaches the true 10th score
(numpy over the stored vectors). Latency is one query at a time through ``PgSearcher.nearest``,
p50 over the queries.

Printed and appended to ``--out`` as one JSON line: the rule's setting, the cheapest sweep
setting whose held-out recall reaches the target, their ratio in ``ef_search`` and in p50
latency, and the curve.

Run: PYTHONPATH=src .venv/bin/python bench/bench_pg_tuner.py --n 100000 [--pg-build "pgvector 0.8"]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_search import fill
from bench.embedding_data import clustered_rows

from themis_clip.index.search import VectorIndex
from themis_clip.index.searchers.postgres import PgSearcher

#: ``hnsw.ef_search`` values tried, cheapest first, in steps of ~1.25x (pgvector's largest: 1000).
EF_SWEEP = (40, 50, 64, 80, 100, 125, 160, 200, 250, 320, 400, 500, 640, 800, 1000)


def kth_scores(data: np.ndarray, queries: np.ndarray, k: int = 10) -> np.ndarray:
    """Each query's true ``k``-th best cosine score over ``data``."""
    out = np.empty(len(queries), np.float32)
    for start in range(0, len(queries), 100):
        scores = queries[start : start + 100] @ data.T
        out[start : start + 100] = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
    return out


def held_out_point(
    pg: PgSearcher, ef: int, queries: np.ndarray, kth: np.ndarray
) -> dict[str, float]:
    pg.expansion_search = ef
    pg.nearest(queries[0], 10)  # warm
    recalls, ms = [], []
    for q, bar in zip(queries, kth, strict=True):
        t0 = time.perf_counter()
        _, scores = pg.nearest(q, 10)
        ms.append((time.perf_counter() - t0) * 1000)
        recalls.append(float(np.sum(scores >= bar - 1e-5)) / 10)
    values = np.asarray(recalls)
    return {
        "ef_search": ef,
        "recall_at_10": float(values.mean()),
        "recall_se": float(values.std(ddof=1) / np.sqrt(len(values))),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pg-build", default="pgvector 0.6", choices=["pgvector 0.6", "pgvector 0.8"]
    )
    parser.add_argument("--out", default="bench/pg-tuner-results.jsonl")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="passes over the held-out curve, the settings taken in turn in each; p50 is the "
        "median of the passes' p50s (latency is noisy on a shared machine)",
    )
    args = parser.parse_args()
    from tests.pg import running_server

    rng = np.random.default_rng(args.seed)
    both = clustered_rows(rng, args.n + args.queries, args.dim)
    data, queries = both[: args.n], both[args.n :]  # held out: never stored
    kth = kth_scores(data, queries)
    with (
        running_server(args.pg_build) as server,
        VectorIndex(server.url()) as index,
    ):
        t0 = time.perf_counter()
        fill(index, data, 5_000)
        insert_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        index.prepare_graph()  # CREATE INDEX ... USING hnsw
        prepare_s = time.perf_counter() - t0
        plan = index.plan
        assert plan is not None
        assert plan.expansion_search is not None
        pg = index.searcher
        assert isinstance(pg, PgSearcher)
        chosen = plan.expansion_search
        print(f"{args.pg_build}, n {args.n}: {plan.reason}")
        print(f"  insert {insert_s:.0f} s, index {prepare_s:.0f} s")
        curve: list[dict[str, Any]] = []
        cheapest: dict[str, Any] | None = None
        for ef in sorted({*EF_SWEEP, chosen}):  # the rule's setting measured too
            point = held_out_point(pg, ef, queries, kth)
            curve.append(point)
            print(
                f"  ef_search {ef}: held-out {point['recall_at_10']:.4f} "
                f"±{point['recall_se']:.4f}  p50 {point['p50_ms']:.2f} ms"
            )
            if cheapest is None and point["recall_at_10"] >= args.target:
                cheapest = point
            if cheapest is not None and ef >= chosen:
                break
        for _ in range(args.rounds - 1):  # again, each setting in turn: p50 over the passes
            for point in curve:
                again = held_out_point(pg, point["ef_search"], queries, kth)
                point.setdefault("p50_rounds_ms", [point["p50_ms"]]).append(again["p50_ms"])
        for point in curve:
            if "p50_rounds_ms" in point:
                point["p50_ms"] = float(np.median(point["p50_rounds_ms"]))
                print(
                    f"  ef_search {point['ef_search']}: p50 over {args.rounds} passes "
                    f"{point['p50_ms']:.2f} ms ("
                    + ", ".join(f"{x:.2f}" for x in point["p50_rounds_ms"])
                    + ")"
                )
        at_chosen = next(p for p in curve if p["ef_search"] == chosen)
        result: dict[str, Any] = {
            "n": args.n,
            "rounds": args.rounds,
            "dim": args.dim,
            "queries": args.queries,
            "pg_build": args.pg_build,
            "pgvector": index.store.extension_version,  # type: ignore[attr-defined]
            "target": args.target,
            "insert_s": insert_s,
            "index_s": prepare_s,
            "chosen_ef": chosen,
            "chosen_held_out": at_chosen,
            "held_out_sweep": curve,
        }
        if cheapest is not None:
            result["cheapest_ef"] = cheapest["ef_search"]
            result["ef_ratio"] = chosen / cheapest["ef_search"]
            result["p50_ratio"] = at_chosen["p50_ms"] / cheapest["p50_ms"]
            print(
                f"  chosen {chosen} (held-out {at_chosen['recall_at_10']:.4f}, "
                f"{at_chosen['p50_ms']:.2f} ms); cheapest reaching {args.target}: "
                f"{cheapest['ef_search']} ({cheapest['p50_ms']:.2f} ms); ratio ef "
                f"{result['ef_ratio']:.2f}, p50 {result['p50_ratio']:.2f}"
            )
        else:
            print(f"  no sweep setting reached {args.target} on held-out queries")
    with open(args.out, "a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
