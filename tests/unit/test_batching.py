from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from themis_clip.batching import MicroBatcher, QueueFullError


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_concurrent_calls_are_coalesced_in_order() -> None:
    calls: list[list[int]] = []

    def fn(items: list[int]) -> list[int]:
        calls.append(items)
        return [i * 10 for i in items]

    async def main() -> list[int]:
        b = MicroBatcher(fn, max_batch_size=8, max_queue_delay_ms=50)
        out = await asyncio.gather(*(b.submit(i) for i in range(20)))
        await b.close()
        return list(out)

    assert run(main()) == [i * 10 for i in range(20)]
    assert [len(c) for c in calls] == [8, 8, 4]  # max_batch_size respected
    assert [x for c in calls for x in c] == list(range(20))


def test_a_lonely_request_waits_at_most_the_delay() -> None:
    async def main() -> float:
        b = MicroBatcher(lambda xs: xs, max_batch_size=64, max_queue_delay_ms=30)
        t0 = time.monotonic()
        # A batcher that waited for a full batch would never answer: bounded, not hanging.
        assert await asyncio.wait_for(b.submit(1), timeout=30) == 1
        await b.close()
        return time.monotonic() - t0

    # 30 ms of delay; the slack is for a loaded 2-core machine, not for the batcher.
    assert run(main()) < 5


def test_queue_full() -> None:
    gate = threading.Event()
    entered = threading.Event()

    def slow(items: list[int]) -> list[int]:
        entered.set()
        gate.wait(5)
        return items

    async def until(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 5
        while not condition():
            assert time.monotonic() < deadline, "condition never held"
            await asyncio.sleep(0.001)

    async def main() -> None:
        b = MicroBatcher(
            slow, max_batch_size=1, max_queue_delay_ms=0, max_queue=3, max_concurrent_batches=1
        )
        first = asyncio.create_task(b.submit(0))
        assert await asyncio.to_thread(entered.wait, 5)  # running, holding the only slot
        waiting = [asyncio.create_task(b.submit(i)) for i in (1, 2)]
        timed = asyncio.create_task(b.submit(3, timeout_s=0.2))
        await until(lambda: b.depth == 3)
        with pytest.raises(QueueFullError) as info:
            await b.submit(4)
        assert info.value.retry_after_s >= 1
        with pytest.raises(TimeoutError):  # the batcher's own timeout, while the gate is shut
            await timed
        gate.set()
        assert await first == 0 and [await w for w in waiting] == [1, 2]
        await b.close()

    run(main())


def test_timeout_leaves_the_batch_running_for_others() -> None:
    gate = threading.Event()

    def slow(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    async def main() -> None:
        b = MicroBatcher(slow, max_batch_size=4, max_queue_delay_ms=20)
        patient = asyncio.create_task(b.submit(1))
        with pytest.raises(TimeoutError):
            await b.submit(2, timeout_s=0.1)
        gate.set()
        assert await patient == 1
        await b.close()

    run(main())


def test_batch_failure_reaches_every_caller_and_close_drains() -> None:
    def boom(items: list[int]) -> list[int]:
        raise RuntimeError("model exploded")

    async def main() -> None:
        b = MicroBatcher(boom, max_batch_size=4, max_queue_delay_ms=10)
        results = await asyncio.gather(*(b.submit(i) for i in range(3)), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)
        ok = MicroBatcher(lambda xs: xs, max_batch_size=4, max_queue_delay_ms=200)
        pending = [asyncio.create_task(ok.submit(i)) for i in range(3)]
        deadline = time.monotonic() + 5
        while ok.depth < 3:  # all three queued (the batch waits up to 200 ms to fill)
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        await ok.close()  # finishes what was queued
        assert [p.result() for p in pending] == [0, 1, 2]
        with pytest.raises(QueueFullError, match="shutting down"):
            await ok.submit(9)

    run(main())


def test_a_failed_batch_leaves_no_reference_cycle_holding_its_items() -> None:
    """The batch's error reaches every caller, and nothing of it waits for the cyclic
    collector: a cycle through the frames that hold the items kept them (request images, up to
    20 MB each) alive until a full collection."""
    import gc

    class Item:
        pass

    def boom(items: list[Item]) -> list[int]:
        raise RuntimeError("model exploded")

    async def main() -> list[str]:
        b: MicroBatcher[Item, int] = MicroBatcher(boom, max_batch_size=2, max_queue_delay_ms=1)
        gc.collect()
        gc.disable()
        try:
            for call in (
                lambda: b.submit(Item()),
                lambda: b.submit_many([Item() for _ in range(5)]),
            ):
                with pytest.raises(RuntimeError, match="exploded"):
                    await call()
            await asyncio.sleep(0)  # the batches' tasks end
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = [type(o).__name__ for o in gc.garbage]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        await b.close()
        return left

    left = run(main())
    assert "Item" not in left, left[:30]


def test_dispatch_when_idle_sends_a_lone_request_at_once_and_still_coalesces_under_load() -> None:
    calls: list[list[int]] = []
    release = threading.Event()

    def fn(items: list[int]) -> list[int]:
        calls.append(items)
        if items == [0]:
            assert release.wait(30)
        return items

    async def main() -> None:
        # An hour of delay: a batcher that waited for company here would never answer in time.
        b = MicroBatcher(
            fn, max_batch_size=8, max_queue_delay_ms=3_600_000, dispatch_when_idle=True
        )
        first = asyncio.create_task(b.submit(0))
        deadline = time.monotonic() + 30
        while not calls:  # the idle batcher sent it alone, without waiting
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        rest = [asyncio.create_task(b.submit(1))]
        for _ in range(20):  # the batcher's loop runs: item 1 must wait, the model is busy
            await asyncio.sleep(0)
        rest += [asyncio.create_task(b.submit(i)) for i in (2, 3)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert b.depth == 3 and len(calls) == 1
        release.set()  # the model goes idle: the waiting three go at once, together
        assert await asyncio.wait_for(first, 30) == 0
        assert await asyncio.wait_for(asyncio.gather(*rest), 30) == [1, 2, 3]
        await b.close()

    run(main())
    assert calls == [[0], [1, 2, 3]]
