"""Do the other services' doors cost throughput against ``/v1/embeddings``? (issue 41)

One real ``themis-clip serve`` (the packaged demo model: a small model, so HTTP and the
translation weigh the most they can), 8 concurrent clients, one input per request, in one
run: each round runs every door for ``--seconds`` in a shuffled order, for a text workload
and an image workload (a 640x480 JPEG). Prints requests/s per door (median over rounds) and
its ratio to ``/v1/embeddings`` in the same rounds; the target is >= 0.95 (no cost beyond noise).

Usage: PYTHONPATH=src .venv/bin/python bench/bench_doors.py [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.helpers import ServerProcess, photo_like
from themis_clip import demo_model_path

CLIENTS = 8
TEXT = "a red circle on the left"


def jpeg() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo_like(640, 480, 3)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


Request = Callable[[httpx.AsyncClient], Any]


def doors(model: str, image: bytes) -> dict[str, dict[str, Request]]:
    """door → workload → a coroutine sending one request."""
    url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    visual = json.dumps({"clip": {"visual": {"modelName": model}}})
    textual = json.dumps({"clip": {"textual": {"modelName": model, "options": {}}}})

    def post(path: str, body: dict[str, Any]) -> Request:
        return lambda c: c.post(path, json=body)

    def chat(part: dict[str, Any]) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": [part]}]}

    return {
        "/v1/embeddings": {
            "text": post("/v1/embeddings", {"model": model, "input": [TEXT]}),
            "image": post("/v1/embeddings", {"model": model, "input": [url]}),
        },
        "ollama /api/embed": {
            "text": post("/api/embed", {"model": model, "input": [TEXT]}),
            "image": post("/api/embed", {"model": model, "input": [url]}),
        },
        "TEI /embed": {
            "text": post("/embed", {"inputs": [TEXT]}),
            "image": post("/embed", {"inputs": [url]}),
        },
        "cohere /v2/embed": {
            "text": post(
                "/v2/embed", {"model": model, "input_type": "search_query", "texts": [TEXT]}
            ),
            "image": post("/v2/embed", {"model": model, "input_type": "image", "images": [url]}),
        },
        "jina typed": {
            "text": post("/v1/embeddings", {"model": model, "input": [{"text": TEXT}]}),
            "image": post("/v1/embeddings", {"model": model, "input": [{"image": url}]}),
        },
        "vLLM messages": {
            "text": post("/v1/embeddings", chat({"type": "text", "text": TEXT})),
            "image": post("/v1/embeddings", chat({"type": "image_url", "image_url": {"url": url}})),
        },
        "immich /predict": {
            "text": lambda c: c.post("/predict", data={"entries": textual, "text": TEXT}),
            "image": lambda c: c.post(
                "/predict",
                data={"entries": visual},
                files={"image": ("blob", image, "application/octet-stream")},
            ),
        },
    }


async def throughput(base: str, send: Request, seconds: float) -> float:
    """Requests/s of CLIENTS clients, each sending one request after another."""
    done = 0
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        for _ in range(2):  # warm connections and paths
            (await send(client)).raise_for_status()
        deadline = time.perf_counter() + seconds

        async def one() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                r = await send(client)
                r.raise_for_status()
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(CLIENTS)))
        return done / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    image = jpeg()
    with ServerProcess(["--model", str(demo_model_path()), "--max-queue-delay-ms", "2"]) as s:
        model = httpx.get(f"{s.base}/v1/models").json()["data"][0]["id"]
        table = doors(model, image)
        rng = random.Random(0)
        for workload in ("text", "image"):
            rates: dict[str, list[float]] = {d: [] for d in table}
            for _ in range(args.rounds):
                order = list(table)
                rng.shuffle(order)
                for door in order:
                    rate = asyncio.run(throughput(s.base, table[door][workload], args.seconds))
                    rates[door].append(rate)
            base = statistics.median(rates["/v1/embeddings"])
            print(f"\n{workload}: {CLIENTS} clients, {args.rounds} rounds x {args.seconds} s")
            print(f"{'door':<20} {'req/s':>8} {'vs /v1/embeddings':>18}")
            for door, values in rates.items():
                rate = statistics.median(values)
                print(f"{door:<20} {rate:8.1f} {rate / base:18.2f}")


if __name__ == "__main__":
    main()
