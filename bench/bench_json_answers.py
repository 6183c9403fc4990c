"""What writing a JSON answer costs: FastAPI's own way (``jsonable_encoder``, then the standard
library's ``json.dumps`` in ``JSONResponse``) against our :class:`JSONRoute` (orjson, one step),
side by side in one run, on the answers the server sends most: one 512-d embedding
(``/v1/embeddings``), 32 of them, and a search page of 10 hits with their metadata.

Two measures for each: the writing alone (what the route does after the endpoint returns) and a
whole request through an in-process app with the same endpoint on each route class.

Run: .venv/bin/python bench/bench_json_answers.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter, FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_openvino import cpu_lines

from themis_clip.server.bodies import JSONAnswer, JSONRoute


def embeddings(n: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        v = rng.standard_normal(512).astype(np.float32)
        v /= np.linalg.norm(v)
        rows.append({"object": "embedding", "index": i, "embedding": [float(x) for x in v]})
    return {"object": "list", "data": rows, "model": "clip", "usage": {"prompt_tokens": 0}}


def page() -> dict[str, Any]:
    hits = [
        {
            "key": f"/photos/2024/IMG_{4700 + i}.jpg",
            "score": 0.3 - i / 100,
            "path": f"/photos/2024/IMG_{4700 + i}.jpg",
            "metadata": {"taken": "2024-05-01T12:00:00", "camera": "X100V", "w": 4000, "h": 3000},
            "text_matches": [],
        }
        for i in range(10)
    ]
    return {"results": hits, "mode": "graph", "model": "clip", "next": "abc", "cut": {}}


def best_ms(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def client(route_class: type[APIRoute], payload: dict[str, Any]) -> TestClient:
    router = APIRouter(route_class=route_class)

    @router.get("/answer", response_model=None)
    async def answer() -> dict[str, Any]:
        return payload

    app = FastAPI()
    app.include_router(router)
    return TestClient(app)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    for line in cpu_lines():
        print(line)
    cases = {"1 embedding": embeddings(1), "32 embeddings": embeddings(32), "10-hit page": page()}
    print(f"{'answer':<15} {'measure':<10} {'FastAPI ms':>11} {'orjson ms':>10} {'ratio':>7}")
    for name, payload in cases.items():
        same = json.loads(JSONAnswer(payload).body)
        assert same == json.loads(JSONResponse(jsonable_encoder(payload)).body)  # same values
        fastapi = best_ms(lambda p=payload: JSONResponse(jsonable_encoder(p)).body, args.rounds)
        ours = best_ms(lambda p=payload: JSONAnswer(p).body, args.rounds)
        print(f"{name:<15} {'writing':<10} {fastapi:>11.3f} {ours:>10.3f} {fastapi / ours:>6.1f}x")
        plain, answered = client(APIRoute, payload), client(JSONRoute, payload)
        assert plain.get("/answer").json() == answered.get("/answer").json()
        fastapi = best_ms(lambda c=plain: c.get("/answer"), args.rounds)
        ours = best_ms(lambda c=answered: c.get("/answer"), args.rounds)
        print(f"{name:<15} {'request':<10} {fastapi:>11.3f} {ours:>10.3f} {fastapi / ours:>6.1f}x")


if __name__ == "__main__":
    main()
