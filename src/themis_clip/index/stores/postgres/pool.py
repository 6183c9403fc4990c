"""A small bounded pool of connections, one per thread at a time (the PostgreSQL store's).

Driver-free: it hands out whatever ``reconnect`` makes, and asks it again for each connection
it hands out (``reconnect(conn)`` returns ``conn`` while usable, else a new one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Pool"]


class Pool:
    """Up to ``size`` connections; a thread asking for one when all are in use waits.

    Args:
        reconnect: ``conn`` (None: none yet) made usable: itself, or a new connection.
        size: connections open at most.
        first: a connection already open, the pool's first.
    """

    def __init__(self, reconnect: Callable[[Any | None], Any], *, size: int, first: Any) -> None:
        self._reconnect = reconnect
        self._size = size
        self._cond = threading.Condition()
        self._idle: list[Any] = [first]
        self._opened = 1
        self._closed = False

    def acquire(self) -> Any:
        with self._cond:
            while not self._idle and self._opened >= self._size:
                self._cond.wait()
            conn = self._idle.pop() if self._idle else None
            if conn is None:
                self._opened += 1
        try:
            return self._reconnect(conn)
        except BaseException:
            with self._cond:
                self._opened -= 1
                self._cond.notify()
            raise

    def release(self, conn: Any) -> None:
        with self._cond:
            if self._closed:
                conn.close()
                self._opened -= 1
            else:
                self._idle.append(conn)
            self._cond.notify()

    def close(self) -> None:
        """Close the idle connections now, the others when they are released."""
        with self._cond:
            self._closed = True
            for conn in self._idle:
                conn.close()
            self._opened -= len(self._idle)
            self._idle.clear()
