"""Pure ASGI middleware: body-size limit (declared or streamed) and request observation."""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from themis_clip.server.errors import error_response

__all__ = ["BodyLimit", "Observe"]


class BodyLimit:
    """Pure ASGI middleware: 413 for bodies over the limit, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = error_response(413, "PayloadTooLarge", f"request body over {self.limit} bytes")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await too_large(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLargeError
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLargeError:
            if not started:
                await too_large(scope, receive, send)


class _BodyTooLargeError(Exception):
    pass


class Observe:
    """Pure ASGI middleware: request count and latency per route template and status."""

    def __init__(self, app: ASGIApp, record: Callable[[str, int, float], None]) -> None:
        self.app, self.record = app, record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = str(getattr(scope.get("route"), "path", "unmatched"))
            self.record(route, status, time.perf_counter() - t0)
