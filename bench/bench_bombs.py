"""Peak server memory for decompression bombs under the pixel cap, and time to drop slow clients.

Starts a real ``themis-clip serve`` (default limits: 178,956,970-pixel cap, 200,000,000-pixel
budget in flight) and sends a 13000x13000 PNG (169 Mpx, ~0.5 MB on the wire, 645 MB decoded as
Pillow's 4-byte RGB) once, then 8 at once to /embed/image and to /index/items (thumbnail
included); reports the growth of the server's peak RSS (VmHWM, reset before each burst).
Then opens 100 silent and 100 half-sent connections and times how long the server takes to drop
them all (header timeout). Run: ``.venv/bin/python bench/bench_bombs.py``.
"""

from __future__ import annotations

import base64
import io
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import ServerProcess


def hwm_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    side = 13000
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (9, 99, 199)).save(buf, "PNG")
    bomb = buf.getvalue()
    decoded = side * side * 4 // 2**20
    print(f"bomb: {side}x{side} PNG, {len(bomb) / 1e3:.0f} kB, {decoded} MB decoded")
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(["--index", f"{tmp}/i.db", "--no-warmup", "--header-timeout-s", "10"]) as s,
    ):
        pid = s.proc.pid
        print(f"server idle peak RSS: {hwm_mb(pid)} MB")
        for route, n in (("embed", 1), ("embed", 8), ("index", 1), ("index", 8)):
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            base = hwm_mb(pid)

            def one(i: int, route: str = route, n: int = n) -> int:
                if route == "embed":
                    r = httpx.post(f"{s.base}/embed/image", content=bomb, timeout=600)
                else:
                    item = {"id": f"b{n}-{i}", "image": base64.b64encode(bomb).decode()}
                    r = httpx.post(f"{s.base}/index/items", json={"items": [item]}, timeout=600)
                return r.status_code

            t0 = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                codes = list(pool.map(one, range(n)))
            took = time.perf_counter() - t0
            growth = hwm_mb(pid) - base
            print(
                f"/{route} x{n}: statuses {sorted(set(codes))}, peak RSS growth {growth} MB "
                f"({growth / decoded:.2f}x one decoded image), {took:.1f} s"
            )
        port = int(s.base.rsplit(":", 1)[1])
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
        for sk in socks[100:]:
            sk.sendall(b"POST /embed/text HTTP/1.1\r\nHost: x\r\nContent-Le")
        t0 = time.perf_counter()
        for sk in socks:
            sk.settimeout(60)
            assert sk.recv(16) == b""
            sk.close()
        print(
            f"200 slow connections (100 silent, 100 half-sent headers) dropped after "
            f"{time.perf_counter() - t0:.1f} s (header timeout 10 s)"
        )


if __name__ == "__main__":
    main()
