"""Server throughput under 32 concurrent single-image clients vs offline batched throughput.

Same model (ViT-B/32 architecture, random weights), same 640x480 JPEGs, one run:
1. offline: ``plugin.generate_embedding_batch`` over the images in a separate process;
2. online: the real ``themis-clip serve`` subprocess on loopback, driven by 32 concurrent
   asyncio clients each sending one image per request (``POST /embed/image``).
Prints the ratio online/offline and the request latency p50/p99.

Run: .venv/bin/python bench/bench_server.py [--clients 32] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from make_models import ensure

from tests.helpers import ServerProcess

OFFLINE = r"""
import sys, time, json, glob
from themis_clip import OnnxClipPlugin, PluginConfig
p = OnnxClipPlugin()
assert p.initialize(PluginConfig.from_dict({"model": {"path": sys.argv[1]}, "max_batch_size": int(sys.argv[3])}))
data = [open(f, "rb").read() for f in sorted(glob.glob(sys.argv[2] + "/*.jpg"))]
p.generate_embedding_batch(data[:8])
best = 0.0
for _ in range(2):
    t = time.perf_counter(); r = p.generate_embedding_batch(data); dt = time.perf_counter() - t
    assert all(x.ok for x in r)
    best = max(best, len(data) / dt)
print(json.dumps({"img_s": best}))
"""


def photos(folder: Path, n: int) -> list[bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        path = folder / f"{i:03d}.jpg"
        if not path.exists():
            yy, xx = np.mgrid[0:480, 0:640]
            base = np.stack(
                [128 + 90 * np.sin(xx / (9 + i % 7) + c) * np.cos(yy / (13 + c)) for c in range(3)],
                -1,
            )
            arr = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(arr).save(path, quality=90)
        out.append(path.read_bytes())
    return out


async def drive(
    base: str, data: list[bytes], clients: int, seconds: float
) -> tuple[int, list[float], int]:
    latencies: list[float] = []
    failures = 0
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(
        timeout=60, limits=httpx.Limits(max_connections=clients)
    ) as client:

        async def one(k: int) -> None:
            nonlocal failures
            i = k
            while time.monotonic() < stop:
                t = time.perf_counter()
                r = await client.post(f"{base}/embed/image", content=data[i % len(data)])
                latencies.append(time.perf_counter() - t)
                failures += r.status_code != 200
                i += clients

        await asyncio.gather(*(one(k) for k in range(clients)))
    return len(latencies), latencies, failures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    model = ensure("vit-b-32")
    folder = Path(__file__).resolve().parent / "data" / "jpeg-640x480"
    data = photos(folder, 64)
    offline = json.loads(
        subprocess.run(
            [sys.executable, "-c", OFFLINE, str(model), str(folder), str(args.batch)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["img_s"]
    server = ServerProcess(  # the tests' helper: a real `themis-clip serve` on a port it binds
        [
            "--model",
            str(model),
            "--batch-size",
            str(args.batch),
            "--max-queue-delay-ms",
            "10",
        ]
    )
    base = server.base
    try:
        asyncio.run(drive(base, data, args.clients, 3))  # warm connections and batches
        n, lat, failures = asyncio.run(drive(base, data, args.clients, args.seconds))
        stats = httpx.get(f"{base}/stats").json()
    finally:
        server.__exit__()
    online = n / args.seconds
    result = {
        "offline_img_s": offline,
        "online_img_s": online,
        "ratio": online / offline,
        "p50_ms": float(np.percentile(lat, 50)) * 1000,
        "p99_ms": float(np.percentile(lat, 99)) * 1000,
        "failures": failures,
        "mean_batch_size": stats["mean_batch_size"],
        "clients": args.clients,
    }
    print(
        f"offline batched: {offline:.1f} img/s; server with {args.clients} clients: {online:.1f} img/s "
        f"(x{online / offline:.2f}); latency p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms; "
        f"mean batch {stats['mean_batch_size']:.1f}; failures {failures}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
