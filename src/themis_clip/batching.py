"""Dynamic micro-batching: concurrent single-item calls coalesced into batched model calls.

A request waits at most ``max_queue_delay_ms`` for company; a batch closes early when it
reaches ``max_batch_size``. The batch function runs in a worker thread (decoding and
inference never block the event loop), and up to ``max_concurrent_batches`` batches run at
once, so the next batch decodes while the current one is in the session. The queue is
bounded: beyond ``max_queue`` waiting items, :class:`QueueFullError` tells the caller to come
back later instead of letting latency grow without limit. A request's items are admitted all
at once or not at all (:meth:`MicroBatcher.submit_many`): a request that could never fit is
:class:`RequestTooLargeError`, one that does not fit now is :class:`QueueFullError`.

A caller that stops waiting (its timeout passed, or its request was cancelled because the
client went away) takes its items out of the queue: no batch decodes or embeds them for
nobody (``BatcherStats.skipped``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from themis_clip.errors import QueueFullError, RequestTooLargeError

__all__ = ["BatcherStats", "MicroBatcher", "QueueFullError"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class BatcherStats:
    batches: int = 0
    items: int = 0
    #: items dropped from the queue because their caller stopped waiting
    skipped: int = 0


@dataclass
class _Pending(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    enqueued: float


class MicroBatcher(Generic[T, R]):
    """Coalesce ``submit`` calls into ``batch_fn`` calls.

    Args:
        batch_fn: maps a list of items to a list of results of the same length (run in a thread).
        max_batch_size: largest batch.
        max_queue_delay_ms: longest a request waits for a batch to fill.
        max_queue: most items waiting (not yet in a running batch).
        max_concurrent_batches: batches running at once.
        on_batch: called with each batch size (metrics).
        dispatch_when_idle: when no batch is running, send what is queued at once instead of
            waiting ``max_queue_delay_ms`` for company: an idle model gains nothing from the
            wait, so a lone client pays no delay; under load, batches still fill while the
            model is busy.
    """

    def __init__(
        self,
        batch_fn: Callable[[list[T]], Sequence[R]],
        *,
        max_batch_size: int = 32,
        max_queue_delay_ms: float = 5.0,
        max_queue: int = 1024,
        max_concurrent_batches: int = 2,
        on_batch: Callable[[int], None] | None = None,
        dispatch_when_idle: bool = False,
    ) -> None:
        self.dispatch_when_idle = dispatch_when_idle
        self._fn = batch_fn
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_queue_delay_ms / 1000.0
        self.max_queue = max_queue
        self.max_concurrent_batches = max_concurrent_batches
        self._slots = asyncio.Semaphore(max_concurrent_batches)
        self._queue: list[_Pending[T, R]] = []
        self._wakeup = asyncio.Event()
        self._on_batch = on_batch
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._running: set[asyncio.Task[None]] = set()
        self._avg_batch_s = 0.05
        self.stats = BatcherStats()

    @property
    def depth(self) -> int:
        """Items waiting for a batch."""
        return len(self._queue)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        """Stop taking items; finish everything already queued or running."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    async def submit(self, item: T, *, timeout_s: float | None = None) -> R:
        """Queue ``item`` and wait for its result.

        Raises:
            QueueFullError: the queue holds ``max_queue`` items already.
            TimeoutError: no result within ``timeout_s``.
        """
        (result,) = await self.submit_many([item], timeout_s=timeout_s)
        return result

    async def submit_many(self, items: Sequence[T], *, timeout_s: float | None = None) -> list[R]:
        """Queue all ``items`` at once (or none) and wait for their results, in order.

        Raises:
            RequestTooLargeError: more items than the queue can ever hold (``max_queue``).
            QueueFullError: not enough room now; retry after ``retry_after_s``.
            TimeoutError: not every result within ``timeout_s`` (the unstarted rest is dropped).
        """
        if self._closing:
            raise QueueFullError("the server is shutting down", retry_after_s=1.0)
        if len(items) > self.max_queue:
            raise RequestTooLargeError(
                f"{len(items)} items in one request; this service queues at most "
                f"{self.max_queue} at once (max_queue): split the request"
            )
        if len(self._queue) + len(items) > self.max_queue:
            retry = max(1.0, self._avg_batch_s * len(self._queue) / self.max_batch_size)
            raise QueueFullError(
                f"queue full ({len(self._queue)} of {self.max_queue} waiting, this request "
                f"needs {len(items)})",
                retry_after_s=retry,
            )
        self.start()
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        pending = [_Pending(item, loop.create_future(), now) for item in items]
        # Admitted together, queued a batch at a time with as many batches outstanding as may
        # run at once: another caller's items join the queue between one request's batches
        # (2,048 long texts delayed a one-word query 11 s), and the batches never wait idle.
        piece, window = self.max_batch_size, self.max_concurrent_batches
        queued = 0
        try:
            # shield: a caller that stops waiting must not cancel a running batch's futures.
            async with asyncio.timeout(timeout_s):
                if len(pending) == 1:
                    self._queue.extend(pending)
                    self._wakeup.set()
                    queued = 1
                    return [await asyncio.shield(pending[0].future)]
                outstanding: list[tuple[int, int]] = []  # pieces queued, as slices of pending
                while queued < len(pending):
                    if len(outstanding) >= window:
                        start, stop = outstanding.pop(0)
                        await asyncio.gather(
                            *(asyncio.shield(p.future) for p in pending[start:stop])
                        )
                    stop = min(queued + piece, len(pending))
                    self._queue.extend(pending[queued:stop])
                    self._wakeup.set()
                    outstanding.append((queued, stop))
                    queued = stop
                for start, stop in outstanding:
                    await asyncio.gather(*(asyncio.shield(p.future) for p in pending[start:stop]))
                return [p.future.result() for p in pending]
        except BaseException:
            self._abandon(pending, unqueued=pending[queued:])
            # The error's traceback holds this frame: let go of the items, or they would live
            # on in a cycle (frame -> items' futures -> error -> traceback -> frame) until a
            # full collection (request images, up to 20 MB each).
            pending.clear()
            raise

    def _abandon(
        self, pending: list[_Pending[T, R]], unqueued: list[_Pending[T, R]] | None = None
    ) -> None:
        """The caller stopped waiting: drop its items that no batch has taken yet (``unqueued``:
        those of its pieces that never joined the queue)."""
        gone = {id(p) for p in pending if not p.future.done()}
        if not gone:
            return
        before = len(self._queue)
        self._queue = [p for p in self._queue if id(p) not in gone]
        self.stats.skipped += before - len(self._queue) + len(unqueued or ())
        for p in pending:
            if not p.future.done():
                p.future.cancel()

    async def _loop(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            # Wait for company until the oldest request's delay is used up or the batch is full.
            deadline = self._queue[0].enqueued + self.max_delay_s
            while len(self._queue) < self.max_batch_size and not self._closing:
                if self.dispatch_when_idle and not self._running:
                    break  # the model went idle while these waited: no company is worth it
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            await self._slots.acquire()
            batch, self._queue = (
                self._queue[: self.max_batch_size],
                self._queue[self.max_batch_size :],
            )
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self.dispatch_when_idle:
            self._wakeup.set()  # waiting items may go now

    async def _run(self, batch: list[_Pending[T, R]]) -> None:
        try:
            live = [p for p in batch if not p.future.done()]
            if not live:
                return
            t0 = time.monotonic()
            try:
                results = await asyncio.to_thread(self._fn, [p.item for p in live])
            except BaseException as exc:  # the batch function failed as a whole
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(exc)
                # The futures hold the error, whose traceback holds this frame: let go of
                # the items here (as submit_many does), or they would form a cycle.
                del batch, live, p  # (live is not empty here, so p is bound)
                return
            self._avg_batch_s = 0.8 * self._avg_batch_s + 0.2 * (time.monotonic() - t0)
            self.stats.batches += 1
            self.stats.items += len(live)
            if self._on_batch:
                self._on_batch(len(live))
            for p, r in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(r)
        finally:
            self._slots.release()
