"""The cost of a live migration: search throughput and p99 latency while ``POST /admin/migrate``
moves the index to another model, against steady state, in one run on one server.

A ``themis-clip serve`` process serves the demo model over an index of demo scenes; client
threads send text searches (k=10) throughout. The steady window ends when the migration (to the
demo model's int8 variant: another identity, so every vector is re-embedded) is posted; the
migration window runs from there to its cut-over. Prints both windows and the ratios.

Run: .venv/bin/python bench/bench_migration.py [--items 3000] [--clients 2] [--steady-s 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from themis_clip import ModelConfig, PluginConfig, demo_model_path
from themis_clip.collection import Collection
from themis_clip.demo.scenes import write_gallery

TOKEN = "bench-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
TEXTS = ["a red circle", "a small blue square", "a green triangle at the top", "a yellow star"]


def serve(models: Path, index: Path) -> tuple[subprocess.Popen[str], str]:
    exe = str(Path(sys.executable).parent / "themis-clip")
    args = ["serve", "--port", "0", "--model", str(models / "demo"), "--model-root", str(models)]
    proc = subprocess.Popen(
        [exe, *args, "--index", str(index)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "THEMIS_ADMIN_TOKEN": TOKEN},
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "listening on " in line:
            base = line.split("listening on ", 1)[1].strip()
            break
    else:
        raise SystemExit("the server did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
    deadline = time.monotonic() + 60
    while httpx.get(f"{base}/readyz").status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.1)
    return proc, base


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
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--steady-s", type=float, default=10.0)
    parser.add_argument("--threads", type=int, help="cores the migration uses (its default)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-migration-"))
    try:
        models = work / "models"
        shutil.copytree(demo_model_path(), models / "demo")
        write_gallery(work / "photos", args.items, size=320)
        index = work / "photos.db"
        config = PluginConfig(model=ModelConfig(path=str(models / "demo")))
        with Collection.open(index, config) as collection:
            collection.index_folder(work / "photos")
        proc, base = serve(models, index)
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
        try:
            for t in threads:
                t.start()
            time.sleep(1.0)  # warm: the first searches pay for loading and caching
            steady_start = time.perf_counter()
            time.sleep(args.steady_s)
            body: dict[str, object] = {"path": "demo", "variant": "int8"}
            if args.threads:
                body["threads"] = args.threads
            with httpx.Client(base_url=base, timeout=60) as c:
                migration_start = time.perf_counter()
                r = c.post("/admin/migrate", json=body, headers=ADMIN)
                assert r.status_code == 202, r.text
                while (status := c.get("/admin/migrate", headers=ADMIN).json())["state"] != "done":
                    assert status["state"] not in ("failed", "blocked"), status
                    time.sleep(0.2)
                migration_end = time.perf_counter()
        finally:
            stop.set()
            for t in threads:
                t.join()
            proc.terminate()
            proc.wait(30)
        steady = window(events, steady_start, migration_start)
        during = window(events, migration_start, migration_end)
        out = {
            "items": args.items,
            "clients": args.clients,
            "cpus": os.cpu_count(),
            "migration_items_per_s": round(args.items / (migration_end - migration_start), 1),
            "steady": steady,
            "migrating": during,
            "throughput_ratio": round(during["throughput_rps"] / steady["throughput_rps"], 2),
            "p99_ratio": round(during["p99_ms"] / steady["p99_ms"], 2),
        }
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
