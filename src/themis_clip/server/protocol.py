"""The only module that reaches into uvicorn: an HTTP/1.1 protocol that times out slow headers.

uvicorn times out idle keep-alive connections, but not a connection that never completes its
request headers: 100 silent or half-sent connections (slowloris) stay open for ever, and any
byte received cancels the keep-alive timer. :func:`guarded_h11` returns uvicorn's h11 protocol
with one more timer: from the moment a connection opens, and again after every response, the
client has ``header_timeout_s`` to send complete request headers, or the connection is closed.
Reading the body is bounded by the app's :class:`~themis_clip.server.middleware.RequestGuard`.

It also caps the connections open at once: beyond ``max_connections`` a new connection gets the
documented JSON 503 (``Retry-After: 1``) and is closed, before it can hold anything.
(uvicorn's own ``limit_concurrency`` answers in plain text, and only once headers arrive.)
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["guarded_h11"]


_BUSY_BODY = b'{"error":{"type":"TooManyConnections","message":"too many open connections; retry"}}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: "
    + str(len(_BUSY_BODY)).encode()
    + b"\r\n\r\n"
    + _BUSY_BODY
)


class _GuardedH11Protocol(H11Protocol):
    header_timeout_s = 10.0
    max_connections = 1000

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            transport.write(_BUSY)
            transport.close()
            return
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()  # type: ignore[union-attr]
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        # IDLE: the client has not completed the headers of a request since the timer started.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()  # type: ignore[union-attr]
            self._header_timer = None
        super().connection_lost(exc)


def guarded_h11(header_timeout_s: float, max_connections: int = 1000) -> type[H11Protocol]:
    """uvicorn's h11 protocol class: slow headers time out, connections are capped."""
    return type(
        "GuardedH11Protocol",
        (_GuardedH11Protocol,),
        {"header_timeout_s": header_timeout_s, "max_connections": max_connections},
    )
