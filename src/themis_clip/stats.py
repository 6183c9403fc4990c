"""Thread-safe request statistics with latency percentiles over a sliding window."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

__all__ = ["Statistics"]


class Statistics:
    """Counters and a window of recent call latencies.

    Args:
        window: how many recent call latencies the percentiles are computed over.
    """

    def __init__(self, window: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._window = window
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._started = time.monotonic()
            self._counts = {
                "calls": 0,
                "images": 0,
                "texts": 0,
                "errors": 0,
                "batches": 0,
                "batch_items": 0,
            }
            self._total_latency_ms = 0.0
            self._latencies: deque[float] = deque(maxlen=self._window)

    def record_call(
        self, *, images: int = 0, texts: int = 0, errors: int = 0, latency_ms: float
    ) -> None:
        """One ``generate_*`` call: how many items it carried, how many failed, how long it took."""
        with self._lock:
            c = self._counts
            c["calls"] += 1
            c["images"] += images
            c["texts"] += texts
            c["errors"] += errors
            self._total_latency_ms += latency_ms
            self._latencies.append(latency_ms)

    def record_batch(self, size: int) -> None:
        """One session run over ``size`` items."""
        with self._lock:
            self._counts["batches"] += 1
            self._counts["batch_items"] += size

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            c = dict(self._counts)
            lat = np.fromiter(self._latencies, dtype=np.float64)
            total = self._total_latency_ms
            uptime = time.monotonic() - self._started
        p50, p95, p99 = (
            (float(np.percentile(lat, q)) for q in (50, 95, 99)) if lat.size else (0.0, 0.0, 0.0)
        )
        return {
            "calls": c["calls"],
            "images": c["images"],
            "texts": c["texts"],
            "errors": c["errors"],
            "batches": c["batches"],
            "mean_batch_size": c["batch_items"] / c["batches"] if c["batches"] else 0.0,
            "avg_latency_ms": total / c["calls"] if c["calls"] else 0.0,
            "p50_latency_ms": p50,
            "p95_latency_ms": p95,
            "p99_latency_ms": p99,
            "uptime_s": uptime,
        }
