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

Clients that never read their answers: an answer is written whole into the connection's write
buffer, and a client that does not drain it would keep both for ever (``close()`` waits for the
buffer to empty). When a connection's buffer passes its high-water mark (``pause_writing``) it
has ``send_timeout_s`` to drain below the low-water mark, or it is aborted and its buffer freed;
and the bytes all connections hold in write buffers count against ``max_buffered_bytes``, beyond
which the connections stalled longest are aborted first.

uvicorn answers a request h11 cannot parse with a plain-text 400; here it is the documented
JSON body.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["guarded_h11"]


_BAD_BODY = (
    b'{"error":{"type":"BadRequest","message":"invalid HTTP request '
    b'(malformed request line, headers or chunked framing)"}}'
)
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
    send_timeout_s = 30.0
    max_buffered_bytes = 256 * 2**20

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._send_timer: asyncio.TimerHandle | None = None
        self._stalled_since: float | None = None
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

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._stalled_since = self.loop.time()
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._drop)
        self.loop.call_soon(self._enforce_buffer_budget)  # not inside transport.write()

    def resume_writing(self) -> None:
        self._cancel_send_timer()
        super().resume_writing()

    def _cancel_send_timer(self) -> None:
        if getattr(self, "_send_timer", None) is not None:
            self._send_timer.cancel()  # type: ignore[union-attr]
        self._send_timer, self._stalled_since = None, None

    def _drop(self) -> None:
        """Abort: the buffered answer is discarded (``close()`` would wait to send it)."""
        self._cancel_send_timer()
        if self.transport is not None:
            self.transport.abort()

    def _buffered(self) -> int:
        transport = getattr(self, "transport", None)
        return transport.get_write_buffer_size() if transport is not None else 0

    def _enforce_buffer_budget(self) -> None:
        peers = [c for c in self.connections if isinstance(c, _GuardedH11Protocol)]
        total = sum(c._buffered() for c in peers)
        stalled = sorted(
            (c for c in peers if c._stalled_since is not None),
            key=lambda c: c._stalled_since or 0.0,
        )
        for conn in stalled:
            if total <= self.max_buffered_bytes:
                break
            total -= conn._buffered()
            conn._drop()

    def send_400_response(self, msg: str) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"connection", b"close"),
            (b"content-length", str(len(_BAD_BODY)).encode()),
        ]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers)))
            self.transport.write(self.conn.send(h11.Data(data=_BAD_BODY)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # h11 cannot answer in this state: just close
            pass
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_send_timer()
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()  # type: ignore[union-attr]
            self._header_timer = None
        super().connection_lost(exc)


def guarded_h11(
    header_timeout_s: float,
    max_connections: int = 1000,
    *,
    send_timeout_s: float = 30.0,
    max_buffered_bytes: int = 256 * 2**20,
) -> type[H11Protocol]:
    """uvicorn's h11 protocol class: slow headers and undrained answers time out, connections
    and buffered answer bytes are capped."""
    return type(
        "GuardedH11Protocol",
        (_GuardedH11Protocol,),
        {
            "header_timeout_s": header_timeout_s,
            "max_connections": max_connections,
            "send_timeout_s": send_timeout_s,
            "max_buffered_bytes": max_buffered_bytes,
        },
    )
