"""HTTP latency at one client against model-only batch-1 latency + decode (issue 30, item 3).

Same ViT-B/32 export (``make_models.py hf-vit-b-32``), same 1024x768 JPEGs. In one run:

1. in-process floor: ``ImagePreprocessor`` decode+preprocess of each JPEG and a batch-1 run of
   the same image-tower session, before and after the servers run (context: the load drifts);
2. a real ``themis-clip serve`` subprocess, one client sending one image per request, sequential,
   alternating ``POST /embed/image`` (raw bytes) and ``POST /v1/embeddings`` (a base64 data URL);
3. the same server at 8 concurrent clients on ``/embed/image`` (throughput).

Prints the p50s and, per round, the ratio of the HTTP p50 to the server's own plugin p50 over
the same requests (decode + batch-1 run + normalise, measured inside the server, so the machine's
drifting load hits numerator and denominator alike); the target is <= 1.2. With
``--before OTHER/src`` the server of another tree (e.g. the main branch, without
``dispatch_when_idle``) runs too, interleaved round by round.

Usage: PYTHONPATH=src .venv/bin/python bench/bench_http_latency.py [--requests 30] [--seconds 10]
       [--rounds 2] [--before /work/main/src]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_index_vs_rclip import MODEL, folder

from tests.helpers import ServerProcess


def floor(data: list[bytes], rounds: int = 12) -> tuple[float, float]:
    """Median in-process decode+preprocess ms and batch-1 session ms (no server running)."""
    from themis_clip import OnnxClipPlugin, PluginConfig

    plugin = OnnxClipPlugin(lazy_textual=True)
    assert plugin.initialize(PluginConfig.from_dict({"model": {"path": str(MODEL)}}))
    model = plugin._model
    assert model is not None
    model.embed_pixels(model.preprocessor(data[0])[None])
    dec, run = [], []
    for i in range(rounds):
        t0 = time.perf_counter()
        pixels = model.preprocessor(data[i % len(data)])[None]
        t1 = time.perf_counter()
        model.embed_pixels(pixels)
        dec.append((t1 - t0) * 1e3)
        run.append((time.perf_counter() - t1) * 1e3)
    plugin.shutdown()
    return statistics.median(dec), statistics.median(run)


def one_client(base: str, data: list[bytes], n: int) -> dict[str, float]:
    """p50 of each route at one sequential client, and the server plugin's own p50 meanwhile."""
    lat: dict[str, list[float]] = {"/embed/image": [], "/v1/embeddings": []}
    urls = ["data:image/jpeg;base64," + base64.b64encode(d).decode() for d in data]
    with httpx.Client(timeout=60) as client:
        for i in range(n + 2):
            t0 = time.perf_counter()
            r = client.post(f"{base}/embed/image", content=data[i % len(data)])
            t1 = time.perf_counter()
            assert r.status_code == 200, r.text
            body = {"input": [urls[i % len(urls)]], "modality": "image"}
            r = client.post(f"{base}/v1/embeddings", json=body)
            t2 = time.perf_counter()
            assert r.status_code == 200, r.text
            if i >= 2:  # the first two warm the connection and the session
                lat["/embed/image"].append((t1 - t0) * 1e3)
                lat["/v1/embeddings"].append((t2 - t1) * 1e3)
        stats = client.get(f"{base}/stats").json()
    out = {k: statistics.median(v) for k, v in lat.items()}
    # the library call inside the server: decode + batch-1 session run + normalise, same requests
    out["plugin"] = float(stats["p50_latency_ms"])
    return out


async def clients(base: str, data: list[bytes], k: int, seconds: float) -> float:
    done = 0
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=k)) as client:

        async def one(j: int) -> None:
            nonlocal done
            i = j
            while time.monotonic() < stop:
                r = await client.post(f"{base}/embed/image", content=data[i % len(data)])
                assert r.status_code == 200
                done += 1
                i += k

        await asyncio.gather(*(one(j) for j in range(k)))
    return done / seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--after", default=str(HERE.parent / "src"), help="the src/ tree to test")
    ap.add_argument("--before", default="", help="another src/ tree to compare (interleaved)")
    args = ap.parse_args()
    data = [p.read_bytes() for p in sorted(folder("1024x768", 48).glob("*.jpg"))]
    dec, b1 = floor(data)
    trees = {"after": args.after, "before": args.before}
    p50s: dict[str, list[dict[str, float]]] = {}
    rates: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for label, src in trees.items():
            if not src:
                continue
            server = ServerProcess(["--model", str(MODEL)], env={"PYTHONPATH": src})
            try:
                p50s.setdefault(label, []).append(one_client(server.base, data, args.requests))
                asyncio.run(clients(server.base, data, 8, 2))
                rates.setdefault(label, []).append(
                    asyncio.run(clients(server.base, data, 8, args.seconds))
                )
            finally:
                server.__exit__()
    dec2, b12 = floor(data)
    med = statistics.median
    print(
        f"in-process floor, no server running (before / after the servers): decode "
        f"{dec:.1f} / {dec2:.1f} ms, batch-1 {b1:.1f} / {b12:.1f} ms"
    )
    for label, runs in p50s.items():
        plugin = med([r["plugin"] for r in runs])
        print(f"{label}: server's own plugin p50 (decode + batch-1 + normalise) {plugin:.1f} ms")
        for route in ("/embed/image", "/v1/embeddings"):
            http = med([r[route] for r in runs])
            ratio = med([r[route] / r["plugin"] for r in runs])
            floor_ms = (dec + b1 + dec2 + b12) / 2
            print(
                f"  {route:15s} p50 {http:6.1f} ms  ratio to the plugin's p50 {ratio:.2f}, "
                f"to the in-process floor ({floor_ms:.1f} ms) {http / floor_ms:.2f}"
            )
        print(f"  8 clients /embed/image: {med(rates[label]):.1f} img/s (median of {len(runs)})")


if __name__ == "__main__":
    main()
