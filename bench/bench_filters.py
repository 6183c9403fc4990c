"""Filtered search cost (issue 28, 2.3): 2,000 items with ~500 metadata keys each, a 1 kB filter
on 32 keys no item has (the error path: it names the keys the index has), a filter that matches,
and plain searches while six filtered searches run at once. SQLite, and PostgreSQL on the
tests' server build (``--pg-build``) unless ``--no-pg``.

Run: .venv/bin/python bench/bench_filters.py [--items 2000] [--keys 500] [--no-pg]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from themis_clip.errors import MetadataError
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.index.where import with_filters
from themis_clip.vocabulary import ModelIdentity

DIM = 64


def fill(index: VectorIndex, items: int, keys: int) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((items, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index.bind_model(ModelIdentity.from_model_id("bench@1", sha256="ab" * 32, dim=DIM))
    for start in range(0, items, 250):
        index.store.upsert(
            [
                ItemRow(
                    key=f"k{i}",
                    vector=vectors[i],
                    metadata={f"key{j:03d}": (i + j) % 7 for j in range(keys)},
                )
                for i in range(start, min(items, start + 250))
            ],
            dim=DIM,
        )


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(location: str, items: int, keys: int) -> dict[str, Any]:
    with VectorIndex(location) as index:
        fill(index, items, keys)
        query = np.ones(DIM, np.float32) / np.sqrt(DIM)
        missing = {f"missing-key-{j:02d}-padding": j for j in range(32)}  # ~1 kB as JSON

        def unknown() -> None:
            try:
                index.search(query, 10, where=with_filters(missing))
            except MetadataError:
                return
            raise AssertionError("expected an error naming the unknown keys")

        out: dict[str, Any] = {
            "store": str(index.store.kind),
            "unknown_keys_s": min(timed(unknown) for _ in range(3)),
            "matching_filter_s": min(
                timed(
                    lambda: index.search(query, 10, where=with_filters({"key001": 3, "key002": 4}))
                )
                for _ in range(3)
            ),
            "plain_s": min(timed(lambda: index.search(query, 10)) for _ in range(5)),
        }
        stop = threading.Event()

        def filtering() -> None:
            while not stop.is_set():
                unknown()

        workers = [threading.Thread(target=filtering) for _ in range(6)]
        for w in workers:
            w.start()
        plain = [timed(lambda: index.search(query, 10)) for _ in range(20)]
        stop.set()
        for w in workers:
            w.join()
        out["plain_under_6_filters_p50_s"] = statistics.median(plain)
        out["plain_under_6_filters_max_s"] = max(plain)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--pg-build", default="pgvector 0.6")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(run(str(Path(tmp) / "f.db"), args.items, args.keys))
    if not args.no_pg:
        from tests.pg import running_server

        with running_server(args.pg_build) as server:
            print(run(server.url(server.new_database()), args.items, args.keys))


if __name__ == "__main__":
    main()
