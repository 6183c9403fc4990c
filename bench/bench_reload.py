"""Hot swap under steady load: throughput and p99 latency around a reload vs steady state.

Client threads send single-image requests (a 640x480 JPEG each) to one plugin serving a
ViT-B/32-architecture tower; the harness measures a steady window, then reloads between two
such models (different weights) several times and measures each reload window (from the start
of reload_model to one second after it returns). Prints the ratios reload/steady.

Run: .venv/bin/python bench/bench_reload.py [--clients 4] [--reloads 3] [--steady-s 8]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_models import ensure

from themis_clip import OnnxClipPlugin, PluginConfig


def jpeg() -> bytes:
    rng = np.random.default_rng(0)
    arr = np.clip(rng.normal(128, 40, (480, 640, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def window(events: list[tuple[float, float, bool]], start: float, end: float) -> dict[str, float]:
    lat = np.array([d for t, d, _ in events if start <= t < end])
    failed = sum(1 for t, _, ok in events if start <= t < end and not ok)
    return {
        "requests": int(lat.size),
        "failed": failed,
        "throughput_rps": lat.size / (end - start),
        "p99_ms": float(np.percentile(lat, 99)) * 1000 if lat.size else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--reloads", type=int, default=3)
    parser.add_argument("--steady-s", type=float, default=8.0)
    args = parser.parse_args()
    models = [ensure("vit-b-32"), ensure("vit-b-32", seed=1)]
    configs = [
        PluginConfig.from_dict(
            {"model": {"path": str(m)}, "allow_embedding_space_change": True, "max_batch_size": 8}
        )
        for m in models
    ]
    plugin = OnnxClipPlugin()
    assert plugin.initialize(configs[0]), plugin.last_error
    plugin.warmup()
    data = jpeg()
    events: list[tuple[float, float, bool]] = []  # (end time, latency s, ok)
    lock = threading.Lock()
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            ok = plugin.generate_embedding(data).ok
            t1 = time.perf_counter()
            with lock:
                events.append((t1, t1 - t0, ok))

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # settle
    s0 = time.perf_counter()
    time.sleep(args.steady_s)
    steady = window(events, s0, time.perf_counter())
    reloads = []
    for i in range(args.reloads):
        r0 = time.perf_counter()
        assert plugin.reload_model(configs[(i + 1) % 2]), plugin.last_error
        r1 = time.perf_counter()
        time.sleep(1.0)
        w = window(events, r0, r1 + 1.0)
        w["reload_s"] = r1 - r0
        reloads.append(w)
        time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    failed = sum(1 for _, _, ok in events if not ok)
    print(
        f"steady: {steady['throughput_rps']:.1f} req/s, p99 {steady['p99_ms']:.0f} ms "
        f"({args.clients} clients, 640x480 JPEG, ViT-B/32 arch)"
    )
    for i, w in enumerate(reloads):
        print(
            f"reload {i + 1}: took {w['reload_s']:.2f} s; window {w['throughput_rps']:.1f} req/s "
            f"(x{w['throughput_rps'] / steady['throughput_rps']:.2f}), p99 {w['p99_ms']:.0f} ms "
            f"(x{w['p99_ms'] / steady['p99_ms']:.2f}), failed {w['failed']}"
        )
    tp = float(np.median([w["throughput_rps"] for w in reloads])) / steady["throughput_rps"]
    p99 = float(np.median([w["p99_ms"] for w in reloads])) / steady["p99_ms"]
    print(
        f"median ratio reload/steady: throughput x{tp:.2f}, p99 x{p99:.2f}; "
        f"requests {len(events)}, failed {failed}"
    )
    print(
        json.dumps(
            {
                "steady": steady,
                "reloads": reloads,
                "throughput_ratio": tp,
                "p99_ratio": p99,
                "failed": failed,
            }
        )
    )
    plugin.shutdown()


if __name__ == "__main__":
    main()
