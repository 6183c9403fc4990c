"""The cost of a live migration: search throughput and p99 latency while ``POST /admin/migrate``
moves the index to another model, against steady state, in one run on one server.

A ``themis-clip serve`` process serves the demo model over an index of demo scenes; client
threads send text searches (k=10) throughout. A steady window, then a migration with the
default share of the cores (to the demo model's int8 variant: another identity, so every
vector is re-embedded) from its POST to its cut-over, a second steady window, and a migration
with ``--cores`` (to the int8-dynamic variant). Prints each window and the ratios to the
steady windows.

Run: .venv/bin/python bench/bench_migration.py [--items 2000] [--clients 2] [--cores 0.5]
[--postgres URL] (an empty database with pgvector: the index lives there instead of a file)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from serving import serve

from themis_clip import ModelConfig, PluginConfig, demo_model_path
from themis_clip.collection import Collection
from themis_clip.demo.scenes import write_gallery

TOKEN = "bench-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
TEXTS = ["a red circle", "a small blue square", "a green triangle at the top", "a yellow star"]


def window(events: list[tuple[float, float, bool]], start: float, end: float) -> dict[str, float]:
    lat = np.array([d for t, d, ok in events if start <= t < end and ok])
    return {
        "seconds": round(end - start, 2),
        "requests": int(lat.size),
        "failed": sum(1 for t, _, ok in events if start <= t < end and not ok),
        "throughput_rps": round(lat.size / (end - start), 1),
        "p50_ms": round(float(np.percentile(lat, 50)) * 1000, 2),
        "p99_ms": round(float(np.percentile(lat, 99)) * 1000, 2),
        "max_ms": round(float(lat.max()) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--steady-s", type=float, default=8.0)
    parser.add_argument("--cores", type=float, default=0.5, help="the second migration's share")
    parser.add_argument("--postgres", help="a database URL to hold the index (default: a file)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-migration-"))
    try:
        models = work / "models"
        shutil.copytree(demo_model_path(), models / "demo")
        write_gallery(work / "photos", args.items, size=320)
        index: Path | str = args.postgres or work / "photos.db"
        config = PluginConfig(model=ModelConfig(path=str(models / "demo")))
        with Collection.open(index, config) as collection:
            collection.index_folder(work / "photos")
        proc, base = serve(
            ["--model", str(models / "demo"), "--model-root", str(models), "--index", str(index)],
            {"THEMIS_ADMIN_TOKEN": TOKEN},
        )
        events: list[tuple[float, float, bool]] = []
        stop = threading.Event()

        def client(k: int) -> None:
            with httpx.Client(base_url=base, timeout=60) as c:
                n = k
                while not stop.is_set():
                    body = {"text": TEXTS[n % len(TEXTS)], "k": 10, "cut": "none"}
                    n += 1
                    t0 = time.perf_counter()
                    r = c.post("/search", json=body, headers=ADMIN)
                    events.append((t0, time.perf_counter() - t0, r.status_code == 200))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        marks: list[float] = []

        def migrate(c: httpx.Client, body: dict[str, object]) -> None:
            marks.append(time.perf_counter())
            r = c.post("/admin/migrate", json=body, headers=ADMIN)
            assert r.status_code == 202, r.text
            while (status := c.get("/admin/migrate", headers=ADMIN).json())["state"] != "done":
                assert status["state"] not in ("failed", "blocked"), status
                time.sleep(0.2)
            marks.append(time.perf_counter())

        try:
            for t in threads:
                t.start()
            time.sleep(1.0)  # warm: the first searches pay for loading and caching
            with httpx.Client(base_url=base, timeout=60) as c:
                marks.append(time.perf_counter())
                time.sleep(args.steady_s)
                migrate(c, {"path": "demo", "variant": "int8"})
                time.sleep(args.steady_s)
                migrate(c, {"path": "demo", "variant": "int8-dynamic", "cores": args.cores})
        finally:
            stop.set()
            for t in threads:
                t.join()
            proc.terminate()
            proc.wait(30)
        t0, a0, a1, b0, b1 = marks
        steady = window(events, t0, a0)
        steady2 = window(events, a1, b0)
        default = window(events, a0, a1)
        share = window(events, b0, b1)
        out = {
            "items": args.items,
            "store": "postgresql" if args.postgres else "sqlite",
            "clients": args.clients,
            "cpus": os.cpu_count(),
            "steady": steady,
            "migrating (default share)": default,
            "steady after": steady2,
            f"migrating (cores {args.cores})": share,
            "default: items/s, throughput and p99 ratios": [
                round(args.items / (a1 - a0), 1),
                round(default["throughput_rps"] / steady["throughput_rps"], 2),
                round(default["p99_ms"] / steady["p99_ms"], 2),
            ],
            f"cores {args.cores}: items/s, throughput and p99 ratios": [
                round(args.items / (b1 - b0), 1),
                round(share["throughput_rps"] / steady2["throughput_rps"], 2),
                round(share["p99_ms"] / steady2["p99_ms"], 2),
            ],
        }
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
