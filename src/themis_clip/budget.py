"""A service-wide budget of decoded pixels in flight, so that concurrency cannot multiply a bomb.

An image's header tells its size before anything is decoded; each decode reserves the memory
its decoded frame and every full-size intermediate will hold (the frame in its own mode, an
EXIF-righted copy, the 8-bit copy of a 16-bit image), counted in units of one 4-byte pixel
(Pillow's RGB), after JPEG DCT scaling when the decode uses it, and holds it until the
full-size image is gone. An image larger than the whole budget is refused at once; one within
the pixel limit whose intermediates alone would overflow the budget takes all of it (it runs
alone); otherwise a decode waits, up to ``wait_s``, for other decodes to return theirs.
"""

from __future__ import annotations

import math
import threading
import time
from types import TracebackType

from themis_clip.errors import ImageTooLargeError, ResourceBusyError

__all__ = ["PIXEL_BYTES", "Lease", "PixelBudget"]

#: bytes of one budget unit: a decoded RGB pixel as Pillow stores it
PIXEL_BYTES = 4


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

    def take_bytes(self, nbytes: int, pixels: int) -> None:
        """Reserve ``nbytes`` of decode memory for an image of ``pixels``.

        Above the whole budget only when the image itself is (``ImageTooLargeError``); an
        image within it whose intermediates would not fit takes the whole budget instead.
        """
        units = math.ceil(nbytes / PIXEL_BYTES)
        if pixels <= self._budget.capacity:
            units = min(units, self._budget.capacity)
        self.take(units)

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
