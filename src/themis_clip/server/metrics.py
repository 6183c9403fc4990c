"""Prometheus metrics of one app (its own registry, so several apps can live in one process)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from themis_clip.migration import MigrationProgress, MigrationState

__all__ = ["IDLE_LAG_PERIOD_S", "LAG_PERIOD_S", "Metrics", "lag_period", "watch_loop_lag"]

#: the loop-lag timer's period while requests come in: a stall longer than this is always
#: seen, and read at most this much short
LAG_PERIOD_S = 0.005
#: its period once no request has ended for :data:`IDLE_AFTER_S` (each wake-up costs ~0.1 ms
#: of CPU: every 5 ms, an idle server spent 3.4 % of a core on it)
IDLE_LAG_PERIOD_S = 0.25
IDLE_AFTER_S = 2.0


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("themis_requests", "HTTP requests", ["route", "status"], registry=r)
        self.errors = Counter(
            "themis_request_errors", "HTTP requests that failed", ["route", "type"], registry=r
        )
        self.latency = Histogram(
            "themis_request_seconds",
            "request latency",
            ["route"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.batch_sizes = Histogram(
            "themis_batch_size",
            "items per model batch",
            ["modality"],
            registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        )
        self.guard_events = Counter(
            "themis_guard_events",
            "requests the guard ended: body_timeout, disconnect (work cancelled), deadline, "
            "internal_error",
            ["event"],
            registry=r,
        )
        self.skipped_items = Gauge(
            "themis_skipped_items",
            "queued items dropped because their request timed out or its client left",
            ["modality"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "themis_queue_depth", "items waiting for a batch", ["modality"], registry=r
        )
        self.last_request = -float("inf")  # when the last request ended (time.monotonic)
        self.loop_lag = Histogram(
            "themis_event_loop_lag_seconds",
            f"how late the event loop ran a timer due every {LAG_PERIOD_S * 1e3:g} ms while "
            f"requests come in, every {IDLE_LAG_PERIOD_S:g} s when idle (a stall of the loop "
            "holds up every request, /healthz included)",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5),
        )

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.last_request = time.monotonic()
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def track_migration(self, progress: Callable[[], MigrationProgress | None]) -> None:
        """Gauges of the server's migration, read from ``progress()`` at each scrape."""
        r = self.registry
        items = Gauge(
            "themis_migration_items",
            "the migration's items: done (in the shadow, up to date), total (in the live "
            "index), embedded (by this run), from_previews, missing (cannot be re-embedded)",
            ["kind"],
            registry=r,
        )
        kinds: dict[str, Callable[[MigrationProgress], float]] = {
            "done": lambda p: p.done,
            "total": lambda p: p.total,
            "embedded": lambda p: p.embedded,
            "from_previews": lambda p: p.from_previews,
            "missing": lambda p: len(p.missing),
        }
        for kind, read in kinds.items():
            items.labels(kind).set_function(_reading(progress, read))
        Gauge(
            "themis_migration_items_per_second", "the migration's embedding rate", registry=r
        ).set_function(_reading(progress, lambda p: p.items_per_s))
        Gauge(
            "themis_migration_eta_seconds",
            "seconds the migration needs at its rate (NaN while unknown)",
            registry=r,
        ).set_function(_reading(progress, lambda p: float("nan") if p.eta_s is None else p.eta_s))
        states = Gauge(
            "themis_migration_state", "1 for the migration's state", ["state"], registry=r
        )
        for value in MigrationState:
            states.labels(value.value).set_function(_reading(progress, _is_state(value)))

    def track_queue(
        self, modality: str, depth: Callable[[], int], skipped: Callable[[], int]
    ) -> None:
        self.queue_depth.labels(modality).set_function(depth)
        self.skipped_items.labels(modality).set_function(skipped)


def _is_state(state: MigrationState) -> Callable[[MigrationProgress], float]:
    return lambda p: float(p.state is state)


def _reading(
    progress: Callable[[], MigrationProgress | None],
    read: Callable[[MigrationProgress], float],
) -> Callable[[], float]:
    def value() -> float:
        p = progress()
        return 0.0 if p is None else float(read(p))

    return value


async def watch_loop_lag(
    observe: Callable[[float], None],
    period_s: Callable[[], float] = lambda: LAG_PERIOD_S,
) -> None:
    """Until cancelled: sleep ``period_s()`` on the running loop and ``observe`` how much later
    than due it woke (0 when on time). A stall longer than the period always overlaps a
    wake-up; the reading is then the stall less at most the period."""
    loop = asyncio.get_running_loop()
    while True:
        period = period_s()
        due = loop.time() + period
        await asyncio.sleep(period)
        observe(max(0.0, loop.time() - due))


def lag_period(metrics: Metrics) -> Callable[[], float]:
    """The loop-lag timer's period for ``metrics``' app: short while requests come in."""

    def period() -> float:
        busy = time.monotonic() - metrics.last_request < IDLE_AFTER_S
        return LAG_PERIOD_S if busy else IDLE_LAG_PERIOD_S

    return period
