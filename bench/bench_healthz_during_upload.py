"""How long a ``/healthz`` probe waits while large JSON bodies are uploaded (issue 28 item 6,
issue 30 item 6): the event loop must not stall while a 20 MB body is parsed.

Starts a real ``themis-clip serve`` on the demo model, then, while one thread probes
``/healthz`` back to back, sends ``--bodies`` concurrent POSTs of about ``--mb`` MB each, of
``--shape``: ``image`` (one base64 data URL, the common large body), ``texts`` (many short
strings) or ``objects`` (many small objects in one array: the parser's worst case). Reports
the probes' median and worst latency during the uploads (the requests' own answers do not
matter: random bytes are refused as not an image).

Run: .venv/bin/python bench/bench_healthz_during_upload.py [--mb 18.6] [--bodies 4]
[--shape image|texts|objects] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import ServerProcess
from themis_clip import demo_model_path


def body_of(shape: str, mb: float) -> tuple[str, bytes]:
    size = int(mb * 1e6)
    if shape == "image":
        data = base64.b64encode(os.urandom(size * 3 // 4)).decode()
        doc: object = {"image": "data:image/png;base64," + data, "k": 1}
        return "/search", json.dumps(doc).encode()
    if shape == "texts":
        n = size // 30
        texts = [f"a photo of thing {i}" for i in range(n)]  # refused (422) once parsed
        return "/search", json.dumps({"text": "x", "texts": texts}).encode()
    n = size // 60
    items = [{"id": f"item-{i}", "image": "AAAA", "metadata": {"n": i}} for i in range(n)]
    return "/index/items", json.dumps({"items": items}).encode()


def probe_loop(port: int, stop_file: Path, out: Any) -> None:
    waits = []
    while not stop_file.exists():
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while b'"ok"}' not in reply:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                reply += chunk
        waits.append(time.perf_counter() - t0)
        time.sleep(0.002)
    out.put(waits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=18.6)
    ap.add_argument("--bodies", type=int, default=4)
    ap.add_argument("--shape", choices=["image", "texts", "objects"], default="image")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import tempfile

    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(
            ["--model", str(demo_model_path()), "--index", f"{tmp}/i.db", "--no-warmup"]
        ) as server,
    ):
        route, body = body_of(args.shape, args.mb)
        print(f"{args.bodies} x {len(body) / 1e6:.1f} MB {args.shape} bodies to {route}")
        headers = {"content-type": "application/json"}
        waits: list[float] = []
        statuses: list[int] = []

        port = int(server.base.rsplit(":", 1)[1])

        def probe() -> None:
            # In its own process (the uploads' threads would otherwise hold this process's GIL),
            # on a fresh connection per probe: on a kept-alive one every answer waits ~40 ms
            # for delayed ACKs (the response goes out in two writes), hiding the stalls.
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            proc = ctx.Process(target=probe_loop, args=(port, stop_file, out))
            proc.start()
            started.set()
            waits.extend(out.get())
            proc.join()

        def upload(_: int) -> None:
            with httpx.Client(base_url=server.base, timeout=120) as c:
                statuses.append(c.post(route, content=body, headers=headers).status_code)

        stop_file = Path(tmp) / "stop"
        for _ in range(args.rounds):
            stop_file.unlink(missing_ok=True)
            started = threading.Event()
            prober = threading.Thread(target=probe)
            prober.start()
            started.wait()
            time.sleep(0.5)  # the probe process is up and probing
            with ThreadPoolExecutor(args.bodies) as pool:
                list(pool.map(upload, range(args.bodies)))
            stop_file.touch()
            prober.join()
        ms = sorted(w * 1000 for w in waits)
        print(
            f"healthz during uploads: {len(ms)} probes, median {statistics.median(ms):.1f} ms, "
            f"p99 {ms[int(len(ms) * 0.99)]:.1f} ms, worst {ms[-1]:.1f} ms; "
            f"upload statuses {sorted(set(statuses))}"
        )


if __name__ == "__main__":
    main()
