"""The HTTP edge under hostile clients, before and after issue 28 (a real ``themis-clip serve``).

Three figures, each on a fresh server with the tiny test model:

* ``latency``: 200 ``GET /healthz`` on one kept-alive connection (median, p90). Without
  ``TCP_NODELAY`` on accepted sockets each one waits out Nagle plus delayed ACK (~40 ms).
* ``readers``: 20 clients pipeline 7 ``/embed/text`` requests of 2,048 texts (~1.4 MB answers)
  and never read, on ``--max-connections 20``: the server's extra RSS, and how long until a
  fresh client is served again (never, before: they were held for ever).
* ``uploads``: 20 clients declare 19 MiB bodies, send all but the last byte and stall: the
  server's extra RSS, and how many were refused at once (503).

Usage: ``python bench/bench_edge.py [--src DIR] [--old]`` where ``--src`` is the ``src``
folder to run (default: this checkout's) and ``--old`` leaves out the flags the old server
lacks. Before/after: ``git archive <commit> src | tar -x -C /tmp/before`` then
``--src /tmp/before/src --old``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
HOST = b"Host: 127.0.0.1\r\n"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Server:
    def __init__(self, src: Path, model: Path, extra: list[str]) -> None:
        exe = Path(sys.executable).parent / "themis-clip"
        env = {**os.environ, "PYTHONPATH": str(src)}
        cmd = [str(exe), "serve", "--port", "0", "--model", str(model), "--no-warmup", *extra]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stderr is not None
        line = ""
        while "listening on " not in line:
            line = self.proc.stderr.readline()
            if not line:
                raise SystemExit("server did not start")
        self.base = line.split("listening on ", 1)[1].strip()
        self.port = int(self.base.rsplit(":", 1)[1])
        deadline = time.monotonic() + 60
        while httpx.get(f"{self.base}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def one_response(s: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(x.split(b":")[1])
        for x in head.split(b"\r\n")
        if x.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += s.recv(65536)


def latency(server: Server) -> dict[str, float]:
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        times = []
        for _ in range(201):
            t0 = time.perf_counter()
            s.sendall(b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n")
            one_response(s)
            times.append((time.perf_counter() - t0) * 1000)
    times = sorted(times[1:])
    return {"median_ms": statistics.median(times), "p90_ms": times[int(0.9 * len(times))]}


def served_within(base: str, limit_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    return None


def readers(server: Server, n: int = 20) -> dict[str, float | None]:
    body = json.dumps({"texts": [f"text number {i}" for i in range(2048)]}).encode()
    request = (
        b"POST /embed/text HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    ) * 7
    before = rss_mb(server.proc.pid)
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server.port))
        s.sendall(request)
        socks.append(s)
    time.sleep(8)  # let every connection fill its buffers
    peak = rss_mb(server.proc.pid) - before
    recovered = served_within(server.base, 40)
    out = {"extra_rss_mb_at_8s": round(peak, 1), "fresh_client_served_after_s": recovered}
    out["extra_rss_mb_after"] = round(rss_mb(server.proc.pid) - before, 1)
    for s in socks:
        s.close()
    return out


def uploads(server: Server, n: int = 20) -> dict[str, float]:
    size = 19 * 2**20
    head = (
        b"POST /embed/image HTTP/1.1\r\n" + HOST + b"Content-Type: image/png\r\n"
        b"Content-Length: " + str(size).encode() + b"\r\n\r\n"
    )
    before = rss_mb(server.proc.pid)
    socks, refused = [], 0
    chunk = b"\0" * 2**20
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(head)
        s.settimeout(0.5)
        try:
            if s.recv(64).startswith(b"HTTP/1.1 503"):
                refused += 1
                s.close()
                continue
        except TimeoutError:
            pass
        s.settimeout(30)
        try:
            for _ in range(18):
                s.sendall(chunk)
            s.sendall(chunk[:-1])
        except OSError:
            pass
        socks.append(s)
    time.sleep(3)
    extra = rss_mb(server.proc.pid) - before
    for s in socks:
        s.close()
    return {"extra_rss_mb": round(extra, 1), "refused_at_once": refused}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, default=ROOT / "src")
    ap.add_argument("--old", action="store_true", help="the server before issue 28")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from themis_clip.export.tiny import build_model_dir

    model = build_model_dir(Path(tempfile.mkdtemp()) / "tiny", name="tiny-a", seed=0)
    results: dict[str, object] = {"src": str(args.src)}
    s = Server(args.src, model, [])
    try:
        results["latency"] = latency(s)
    finally:
        s.close()
    extra = ["--max-connections", "20", "--max-queue", "65536"]
    if not args.old:
        extra += ["--send-timeout-s", "5"]
    s = Server(args.src, model, extra)
    try:
        results["readers"] = readers(s)
    finally:
        s.close()
    s = Server(args.src, model, ["--body-idle-timeout-s", "60"])
    try:
        results["uploads"] = uploads(s)
    finally:
        s.close()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
