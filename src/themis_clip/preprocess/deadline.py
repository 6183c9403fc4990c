"""A file object whose reads stop once a decode has run out of time.

Pillow decodes incrementally: ``ImageFile.load`` feeds the codec one block read at a time
(64 KiB), and libjpeg, zlib and the others work on each block as it arrives. Reading through
:class:`DeadlineReader` therefore stops a decode within one block's work of its deadline, in
whatever thread it runs, without killing that thread; the containers' checks
(:mod:`.containers`) bound what one block can cost.
"""

from __future__ import annotations

import time
from typing import Any

from themis_clip.errors import ImageTooLargeError

__all__ = ["DeadlineReader"]


class DeadlineReader:
    """Delegates to ``fp``; ``read`` raises :class:`ImageTooLargeError` past ``deadline``
    (a ``time.monotonic()`` value)."""

    def __init__(self, fp: Any, deadline: float, timeout_s: float) -> None:
        self._fp, self._deadline, self._timeout_s = fp, deadline, timeout_s

    def _check(self) -> None:
        if time.monotonic() > self._deadline:
            raise ImageTooLargeError(
                f"image took longer than {self._timeout_s:g} s to decode (decode_timeout_s): "
                "it costs far more than its size declares"
            )

    def read(self, size: int = -1) -> bytes:
        self._check()
        data: bytes = self._fp.read(size)
        return data

    def readline(self, size: int = -1) -> bytes:
        self._check()
        data: bytes = self._fp.readline(size)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fp, name)
