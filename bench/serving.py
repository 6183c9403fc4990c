"""A ``themis-clip serve`` subprocess for the benchmarks: started on a free port, ready."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def serve(
    args: Sequence[str], env: Mapping[str, str] | None = None, ready_s: float = 120
) -> tuple[subprocess.Popen[str], str]:
    """``themis-clip serve --port 0 ARGS``; returns the process and its base URL once
    ``/readyz`` answers 200 (its stderr is drained in a thread)."""
    exe = str(Path(sys.executable).parent / "themis-clip")
    proc = subprocess.Popen(
        [exe, "serve", "--port", "0", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "listening on " in line:
            base = line.split("listening on ", 1)[1].strip()
            break
    else:
        raise SystemExit("the server did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
    deadline = time.monotonic() + ready_s
    while httpx.get(f"{base}/readyz").status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.1)
    return proc, base
