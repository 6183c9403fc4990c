"""The event loop lag watch behind themis_event_loop_lag_seconds."""

from __future__ import annotations

import asyncio
import contextlib


def test_the_loop_lag_watch_sees_a_stall() -> None:
    """``themis_event_loop_lag_seconds``: a callback that holds the loop for 60 ms shows as a
    lag of at least 60 ms less one period."""
    import time

    from themis_clip.server.metrics import LAG_PERIOD_S, watch_loop_lag

    seen: list[float] = []

    async def main() -> None:
        watch = asyncio.ensure_future(watch_loop_lag(seen.append))
        while len(seen) < 3:  # the watch runs, on time
            await asyncio.sleep(0)
        asyncio.get_running_loop().call_soon(time.sleep, 0.06)  # a stall of the whole loop
        count = len(seen)
        while len(seen) < count + 3:
            await asyncio.sleep(0)
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch

    asyncio.run(main())
    assert max(seen) >= 0.06 - LAG_PERIOD_S, seen
    assert min(seen) >= 0.0


def test_the_loop_lag_watch_slows_down_when_idle() -> None:
    import time

    from themis_clip.server.metrics import IDLE_LAG_PERIOD_S, LAG_PERIOD_S, Metrics, lag_period

    metrics = Metrics()
    period = lag_period(metrics)
    assert period() == IDLE_LAG_PERIOD_S  # no request yet
    metrics.observe("/healthz", 200, 0.001)
    assert period() == LAG_PERIOD_S
    metrics.last_request = time.monotonic() - 60
    assert period() == IDLE_LAG_PERIOD_S
