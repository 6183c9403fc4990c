"""A readers-writer lock: searches share the structures they read; catching up writes alone.

The standard library has none; this one is write-preferring (a waiting writer holds new
readers back, so a stream of searches cannot starve a catch-up) and re-entrant for the writer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ReadWriteLock"]


class ReadWriteLock:
    """Many readers or one writer; a waiting writer holds new readers back (no starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer: int | None = None  # the thread holding the write lock (re-entrant)
        self._depth = 0
        self._waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:  # a writer may read what it holds
                self._depth += 1
            else:
                while self._writer is not None or self._waiting:
                    self._cond.wait()
                self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                if self._writer == me:
                    self._depth -= 1
                else:
                    self._readers -= 1
                    if not self._readers:
                        self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._depth += 1
            else:
                self._waiting += 1
                while self._writer is not None or self._readers:
                    self._cond.wait()
                self._waiting -= 1
                self._writer, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._writer = None
                    self._cond.notify_all()
