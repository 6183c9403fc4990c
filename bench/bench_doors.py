"""Do the other services' doors cost throughput against ``/v1/embeddings``? (issue 41)

One real ``themis-clip serve`` (the packaged demo model: a small model, so HTTP and the
translation weigh the most they can), 8 concurrent clients, one input per request, in one
run, for a text workload and an image workload (a 640x480 JPEG). Each round measures every
door paired with ``/v1/embeddings``, the two back to back in a random order, ``--seconds``
each (a shared machine's load drifts: a pair sees the same load). Prints requests/s per door
and the median over rounds of each pair's ratio to ``/v1/embeddings`` (with its range), and
the same for the server process's CPU time per request (from ``/proc``: what a door costs the
server, which other load on the machine disturbs far less than throughput). The target: a
throughput ratio >= 0.95 and a CPU ratio <= 1.05. Each request body is encoded once, so that
the clients, on the same cores, spend the same on every door.

``--fixed N`` first prints each door's fixed cost: the server CPU per request of a request
naming a model the server does not serve (a 404 after the parse, no model run, no batching;
N rounds, see :func:`fixed_costs`). ``--model`` serves another model folder instead
(``bench/make_models.py hf-vit-b-32``: real ViT-B/32 sizes, so the fixed cost of a request is
seen against real model time).

Usage: PYTHONPATH=src .venv/bin/python bench/bench_doors.py [--seconds 2] [--rounds 5]
       [--model bench/models/hf-vit-b-32] [--workloads text image] [--clients 8] [--fixed 8]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import math
import os
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

REFERENCE = "/v1/embeddings"
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

    def encoded(path: str, **kw: Any) -> Request:
        """A request whose body httpx encodes once: the client's encoder is not the door's
        cost (its multipart encoder costs it 0.8 ms a request more than its JSON one)."""
        request = httpx.Request("POST", f"http://bench{path}", **kw)
        body, headers = request.read(), {"content-type": request.headers["content-type"]}
        return lambda c: c.post(path, content=body, headers=headers)

    def post(path: str, body: dict[str, Any]) -> Request:
        return encoded(path, json=body)

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
        "immich /predict": {  # multipart, as immich's server's FormData always is
            "text": encoded("/predict", files={"entries": (None, textual), "text": (None, TEXT)}),
            "image": encoded(
                "/predict",
                files={
                    "entries": (None, visual),
                    "image": ("blob", image, "application/octet-stream"),
                },
            ),
        },
    }


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(
    base: str, pid: int, send: Request, seconds: float, clients: int
) -> tuple[float, float]:
    """Requests/s of ``clients`` clients, each sending one request after another, and the server's
    CPU milliseconds per request (what the door costs, whatever else loads the machine)."""
    done = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
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

        start, cpu = time.perf_counter(), cpu_s(pid)
        await asyncio.gather(*(one() for _ in range(clients)))
        rate = done / (time.perf_counter() - start)
        return rate, (cpu_s(pid) - cpu) * 1e3 / max(done, 1)


def fixed_costs(base: str, pid: int, image: bytes, rounds: int) -> None:
    """Each door's text request naming a model the server does not serve: a 404 once the body
    is parsed and the name checked, so no model runs and no batch forms. The server's CPU per
    request, one client, 100 requests a block, each door paired with ``/v1/embeddings`` in a
    random order: what a door costs beyond the model, in units a loaded machine blurs less."""
    table = {d: w["text"] for d, w in doors("not-served", image).items()}
    rng = random.Random(1)

    async def block(send: Request) -> float:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            if (await send(client)).status_code != 404:
                return math.nan  # a door without a model name (TEI)
            cpu = cpu_s(pid)
            for _ in range(100):
                await send(client)
            return (cpu_s(pid) - cpu) * 1e3 / 100

    ms: dict[str, list[float]] = {d: [] for d in table}
    ratios: dict[str, list[float]] = {d: [] for d in table}
    for _ in range(rounds):
        for door in (d for d in table if d != REFERENCE):
            pair = [REFERENCE, door]
            rng.shuffle(pair)
            got = {d: asyncio.run(block(table[d])) for d in pair}
            for d, v in got.items():
                ms[d].append(v)
            ratios[door].append(got[door] / got[REFERENCE])
    med = statistics.median
    print(f"\nfixed cost (404: model not served), text, 1 client, {rounds} rounds x 100 requests")
    print(f"{'door':<20} {'server CPU ms/req':>18} {'ratio':>6} {'range':>10}")
    for door, values in ms.items():
        if math.isnan(values[0]):
            continue
        r = ratios[door] or [1.0]
        print(f"{door:<20} {med(values):18.2f} {med(r):6.2f} {min(r):4.2f}-{max(r):4.2f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=8, help="1: no batching")
    p.add_argument("--fixed", type=int, default=0, help="rounds of the fixed-cost table")
    p.add_argument("--model", default=str(demo_model_path()), help="model folder (the demo's)")
    p.add_argument("--workloads", nargs="*", default=["text", "image"], choices=["text", "image"])
    args = p.parse_args()
    image = jpeg()
    with ServerProcess(["--model", args.model, "--max-queue-delay-ms", "2"]) as s:
        model = httpx.get(f"{s.base}/v1/models").json()["data"][0]["id"]
        table = doors(model, image)
        rng = random.Random(0)
        pid = s.proc.pid
        print(f"model: {model}")
        if args.fixed:
            fixed_costs(s.base, pid, image, args.fixed)
        for workload in args.workloads:
            rates: dict[str, list[float]] = {d: [] for d in table}
            cpu: dict[str, list[float]] = {d: [] for d in table}
            ratios: dict[str, list[float]] = {d: [] for d in table}
            cpu_ratios: dict[str, list[float]] = {d: [] for d in table}
            for _ in range(args.rounds):
                others = [d for d in table if d != REFERENCE]
                rng.shuffle(others)
                for door in others:
                    pair = [REFERENCE, door]
                    rng.shuffle(pair)
                    got = {
                        d: asyncio.run(
                            throughput(s.base, pid, table[d][workload], args.seconds, args.clients)
                        )
                        for d in pair
                    }
                    for d, (rate, ms) in got.items():
                        rates[d].append(rate)
                        cpu[d].append(ms)
                    ratios[door].append(got[door][0] / got[REFERENCE][0])
                    cpu_ratios[door].append(got[door][1] / got[REFERENCE][1])
            med = statistics.median
            print(f"\n{workload}: {args.clients} clients, {args.rounds} rounds x {args.seconds} s")
            print(
                f"{'door':<20} {'req/s':>7} {'ratio':>6} {'range':>10}"
                f" {'server CPU ms/req':>18} {'ratio':>6} {'range':>10}"
            )
            print(
                f"{REFERENCE:<20} {med(rates[REFERENCE]):7.1f} {1:6.2f} {'':>10}"
                f" {med(cpu[REFERENCE]):18.2f} {1:6.2f}"
            )
            for door in (d for d in table if d != REFERENCE):
                r, c = ratios[door], cpu_ratios[door]
                print(
                    f"{door:<20} {med(rates[door]):7.1f} {med(r):6.2f} "
                    f"{min(r):4.2f}-{max(r):4.2f} {med(cpu[door]):18.2f} {med(c):6.2f} "
                    f"{min(c):4.2f}-{max(c):4.2f}"
                )


if __name__ == "__main__":
    main()
