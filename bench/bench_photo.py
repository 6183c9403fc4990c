"""Filtered search and near-duplicates at 100k items, on either store (issue 27).

Items carry EXIF-like metadata (``taken`` over three years, ``camera.make`` among 5 makes,
``gps`` over Europe); 1% of the vectors are planted near-copies of another. Prints:

- filtered-search latency (median of repeated searches) for a selective filter (a 3-day
  ``taken`` range and a 20 km radius: ~0.1% of items) and a broad one (one camera make: 20%);
- the duplicate-detection time over the whole collection, and whether every planted pair was
  found.

    PYTHONPATH=src:. python bench/bench_photo.py [--items 100000] [--store sqlite|postgres]
        [--pg-build "pgvector 0.6"|"pgvector 0.8"]

PostgreSQL runs on one of the tests' server builds (``tests/pg.py``), started in a temporary
directory for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from themis_clip.index.duplicates import find_duplicates
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.index.where import parse_where
from themis_clip.vocabulary import ModelIdentity

DIM = 512
MAKES = ["Canon", "NIKON", "Apple", "SONY", "FUJIFILM"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--pg-build", default="pgvector 0.8", help="tests/pg.py build name")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = args.items
    basis = rng.standard_normal((64, DIM)).astype(np.float32)
    vectors = (rng.standard_normal((n, 64)).astype(np.float32) @ basis) + 0.3 * rng.standard_normal(
        (n, DIM)
    ).astype(np.float32)
    planted = rng.choice(n // 2, n // 100, replace=False)
    copies = planted + n // 2
    vectors[copies] = vectors[planted] + 0.02 * np.linalg.norm(
        vectors[planted], axis=1, keepdims=True
    ) / np.sqrt(DIM) * rng.standard_normal((len(planted), DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    start = datetime(2021, 1, 1, tzinfo=UTC)
    with contextlib.ExitStack() as stack:
        if args.store == "postgres":
            from tests.pg import running_server

            server = stack.enter_context(running_server(args.pg_build))
            location = server.url(server.new_database())
            print(f"store: PostgreSQL ({args.pg_build})")
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            location = str(Path(tmp) / "bench.db")
            print("store: SQLite")
        stamp = ModelIdentity.from_model_id("bench@1", sha256="ef" * 32, dim=DIM)
        t0 = time.perf_counter()
        with VectorIndex(location) as index:
            index.bind_model(stamp)
            for s in range(0, n, 5000):
                rows = []
                for i in range(s, min(n, s + 5000)):
                    when = start + timedelta(seconds=int(rng.integers(0, 3 * 365 * 86400)))
                    rows.append(
                        ItemRow(
                            key=f"p{i}",
                            vector=vectors[i],
                            metadata={
                                "taken": when.strftime("%Y-%m-%dT%H:%M:%S+01:00"),
                                "camera": {"make": MAKES[i % 5], "model": f"m{i % 37}"},
                                "gps": {
                                    "lat": float(rng.uniform(36, 60)),
                                    "lon": float(rng.uniform(-10, 30)),
                                },
                            },
                        )
                    )
                index.store.upsert(rows, dim=DIM)
        print(f"items: {n}, loaded in {time.perf_counter() - t0:.1f} s; cores: {os.cpu_count()}")
        filters = {
            "selective": {
                "$or": [
                    {"taken": {"$gte": "2022-06-01", "$lt": "2022-06-04"}},
                    {"gps": {"$near": {"lat": 48.86, "lon": 2.34, "km": 20}}},
                ]
            },
            "broad": {"camera.make": "Canon"},
        }
        with VectorIndex(location, readonly=True, exact_threshold=10**9) as index:
            q = vectors[7]
            for name, where in filters.items():
                matched = len(index.store.ids_where(parse_where(where)))
                times = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    hits = index.search(q, 10, where=where)
                    times.append((time.perf_counter() - t) * 1000)
                print(
                    f"where {name}: {matched} matching items, median {statistics.median(times):.1f} ms, "
                    f"min {min(times):.1f} ms over {args.repeat} searches ({len(hits)} hits)"
                )
            t = time.perf_counter()
            groups = find_duplicates(index, threads=0)  # no saved graph: builds its own
            seconds = time.perf_counter() - t
        pairs = {tuple(sorted(int(i["key"][1:]) for i in g.items)) for g in groups}
        want = {tuple(sorted((int(a), int(b)))) for a, b in zip(planted, copies, strict=True)}
        print(
            f"duplicates: {len(groups)} groups in {seconds:.1f} s; planted pairs found "
            f"{len(want & pairs)}/{len(want)}"
        )


if __name__ == "__main__":
    main()
