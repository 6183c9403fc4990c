"""A service-wide budget of decoded pixels in flight, so that concurrency cannot multiply a bomb.

An image's header tells its size before anything is decoded; each decode reserves that many
pixels (after JPEG DCT scaling, when the decode uses it) and holds them until the full-size
image is gone. An image larger than the whole budget is refused at once; otherwise a decode
waits, up to ``wait_s``, for other decodes to return their pixels.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from themis_clip.errors import ImageTooLargeError, ResourceBusyError

__all__ = ["Lease", "PixelBudget"]


class PixelBudget:
    """At most ``capacity`` decoded pixels held at once, across every thread.

    Args:
        capacity: pixels (width × height) that may be decoded at the same time.
        wait_s: how long a decode waits for room before :class:`ResourceBusyError`.
    """

    def __init__(self, capacity: int, *, wait_s: float = 30.0) -> None:
        if capacity < 1:
            raise ValueError(f"pixel budget must be positive, got {capacity}")
        self.capacity = capacity
        self.wait_s = wait_s
        self._used = 0
        self._peak = 0
        self._waits = 0
        self._cond = threading.Condition()

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "capacity": self.capacity,
                "in_use": self._used,
                "peak": self._peak,
                "waits": self._waits,
            }

    def acquire(self, pixels: int) -> None:
        """Reserve ``pixels``, waiting for room.

        Raises:
            ImageTooLargeError: more than the whole budget.
            ResourceBusyError: no room within ``wait_s``.
        """
        if pixels > self.capacity:
            raise ImageTooLargeError(
                f"image needs {pixels} decoded pixels, more than the service's whole budget of "
                f"{self.capacity} (max_pixels_in_flight)"
            )
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            if self._used + pixels > self.capacity:
                self._waits += 1
            while self._used + pixels > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    if self._used + pixels <= self.capacity:
                        break
                    raise ResourceBusyError(
                        f"busy decoding other large images ({self._used} of {self.capacity} "
                        f"pixels in flight); retry"
                    )
            self._used += pixels
            self._peak = max(self._peak, self._used)

    def release(self, pixels: int) -> None:
        with self._cond:
            self._used -= pixels
            self._cond.notify_all()

    def lease(self) -> Lease:
        return Lease(self)


class Lease:
    """Pixels one decode holds; returned on ``release`` or at the end of a ``with`` block."""

    def __init__(self, budget: PixelBudget) -> None:
        self._budget = budget
        self._held = 0

    def take(self, pixels: int) -> None:
        self._budget.acquire(pixels)
        self._held += pixels

    def release(self) -> None:
        if self._held:
            self._budget.release(self._held)
            self._held = 0

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
