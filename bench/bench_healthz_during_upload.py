"""How long a ``/healthz`` probe waits while large JSON bodies are uploaded (issue 28 item 6,
issue 30 item 6): the event loop must not stall while a 20 MB body is parsed.

Starts a real ``themis-clip serve`` on the demo model, then, while one process probes
``/healthz`` back to back, sends ``--bodies`` concurrent POSTs of about ``--mb`` MB each, of
``--shape``: ``image`` (one base64 data URL, the common large body), ``texts`` (many short
strings) or ``objects`` (many small objects in one array: the parser's worst case). Reports
the probes' median and worst latency during the uploads (the requests' own answers do not
matter: random bytes are refused as not an image), and the server's own event-loop lag over
the same time (``themis_event_loop_lag_seconds`` from ``/metrics``, before and after): the
probes' figure includes the machine's contention, the lag only the loop's own stalls.

Each round starts a fresh server, sends one large body first (what a first large body starts,
such as the parsing process, is not what is measured), then the concurrent ones. ``--before
SRC`` runs a second tree (a ``src`` folder, e.g. main's) in turn with ``--src`` each round.

Run: .venv/bin/python bench/bench_healthz_during_upload.py [--mb 20.9] [--bodies 4]
[--shape image,texts,objects] [--rounds 3] [--before /path/to/main/src]
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
    """A body of ``shape`` as close to ``mb`` MB (10**6 bytes) as its items allow, never over."""
    size = int(mb * 1e6)
    if shape == "image":
        overhead = len(json.dumps({"image": "data:image/png;base64,", "k": 1}))
        data = base64.b64encode(os.urandom((size - overhead) * 3 // 4)).decode()
        doc: object = {"image": "data:image/png;base64," + data, "k": 1}
        return "/search", json.dumps(doc).encode()

    def build(n: int) -> tuple[str, bytes]:
        if shape == "texts":  # refused (422) once parsed: /search takes no "texts"
            texts = [f"a photo of thing {i}" for i in range(n)]
            return "/search", json.dumps({"text": "x", "texts": texts}).encode()
        items = [{"id": f"item-{i}", "image": "AAAA", "metadata": {"n": i}} for i in range(n)]
        return "/index/items", json.dumps({"items": items}).encode()

    n = 1000
    for _ in range(3):  # scale the count to the size (items grow with their index's digits)
        route, body = build(n)
        n = int(n * size / len(body))
    while len(body) > size:
        n = int(n * 0.999)
        route, body = build(n)
    return route, body


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


def run_round(
    src: str, shape: str, mb: float, bodies: int, tmp: str
) -> tuple[list[float], list[int], int, dict[float, float] | None]:
    """One server from ``src`` (a ``src`` folder: its ``themis_clip`` is served), ``bodies``
    concurrent uploads while a separate process probes: (probe waits, statuses, body bytes)."""
    env = {"PYTHONPATH": str(Path(src).resolve())}
    db = Path(tmp) / f"i{time.monotonic_ns()}.db"
    args = ["--model", str(demo_model_path()), "--index", str(db), "--no-warmup"]
    with ServerProcess(args, env=env) as server:
        route, body = body_of(shape, mb)
        headers = {"content-type": "application/json"}
        waits: list[float] = []
        statuses: list[int] = []
        port = int(server.base.rsplit(":", 1)[1])
        stop_file = Path(tmp) / "stop"
        stop_file.unlink(missing_ok=True)
        started = threading.Event()

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

        with httpx.Client(base_url=server.base, timeout=120) as c:  # the first large body
            c.post(route, content=body, headers=headers)  # starts what it needs (a child)
            lag_before = loop_lag(c)
        prober = threading.Thread(target=probe)
        prober.start()
        started.wait()
        time.sleep(0.5)  # the probe process is up and probing
        with ThreadPoolExecutor(bodies) as pool:
            list(pool.map(upload, range(bodies)))
        stop_file.touch()
        prober.join()
        with httpx.Client(base_url=server.base, timeout=120) as c:
            lag_after = loop_lag(c)
        lag = None
        if lag_before is not None and lag_after is not None:
            lag = {le: lag_after[le] - lag_before.get(le, 0) for le in lag_after}
        return waits, statuses, len(body), lag


def loop_lag(client: httpx.Client) -> dict[float, float] | None:
    """The server's own ``themis_event_loop_lag_seconds`` buckets (cumulative counts by upper
    bound), None for a tree that has no such metric."""
    found: dict[float, float] = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("themis_event_loop_lag_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            found[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return found or None


def lag_summary(lags: list[dict[float, float] | None]) -> str:
    """How many of the server's loop-lag readings during the uploads were over 10 / 20 ms, and
    the bucket of the worst (a reading is the stall less at most the timer's 5 ms period)."""
    if any(lag is None for lag in lags):
        return "no loop-lag metric"
    over10 = over20 = 0.0
    worst = 0.0
    for lag in lags:
        assert lag is not None
        total = lag[float("inf")]
        over10 += total - lag[0.01]
        over20 += total - lag[0.02]
        worst = max(worst, min(le for le, n in lag.items() if n == total))
    return f"server loop lag: {over10:.0f} readings over 10 ms, {over20:.0f} over 20 ms, worst <= {worst * 1e3:g} ms"


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    return (
        f"{len(ms)} probes, median {statistics.median(ms):.1f} ms, "
        f"p99 {ms[int(len(ms) * 0.99)]:.1f} ms, worst {ms[-1]:.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20.9, help="body size (the limit: 20.97 MB)")
    ap.add_argument("--bodies", type=int, default=4)
    ap.add_argument("--shape", default="image", help="image, texts, objects, or a comma list")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument(
        "--before", help="another src folder (e.g. main's), run in turn with --src each round"
    )
    args = ap.parse_args()
    import tempfile

    variants = [("after", args.src)] + ([("before", args.before)] if args.before else [])
    for shape in args.shape.split(","):
        found: dict[str, list[list[float]]] = {label: [] for label, _ in variants}
        lags: dict[str, list[dict[float, float] | None]] = {label: [] for label, _ in variants}
        statuses: dict[str, set[int]] = {label: set() for label, _ in variants}
        size = 0
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for label, src in variants if r % 2 == 0 else variants[::-1]:
                    waits, got, size, lag = run_round(src, shape, args.mb, args.bodies, tmp)
                    found[label].append([w * 1000 for w in waits])
                    lags[label].append(lag)
                    statuses[label].update(got)
        print(f"{args.bodies} x {size / 1e6:.2f} MB {shape} bodies, {args.rounds} rounds")
        for label, rounds in found.items():
            worst = ", ".join(f"{max(ms):.1f}" for ms in rounds)
            every = [w for ms in rounds for w in ms]
            print(
                f"  {label:6s} healthz during uploads: {summary(every)} (worst per round: "
                f"{worst}); upload statuses {sorted(statuses[label])}; "
                f"{lag_summary(lags[label])}"
            )


if __name__ == "__main__":
    main()
