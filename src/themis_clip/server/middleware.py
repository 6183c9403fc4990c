"""Pure ASGI middleware: strict framing, the request guard (body, deadline, disconnects,
last-resort errors) and request observation.

:class:`StrictFraming` answers 400 (and closes) a request whose framing is ambiguous: both
``Content-Length`` and ``Transfer-Encoding`` (RFC 9112 section 6.3: a smuggling vector, the
connection must close), or a header that must appear once appearing twice (``Content-Type``,
``Content-Length``, ``Authorization``, ``Host``). It lower-cases the media type of the one
``Content-Type`` (``Multipart/Form-Data`` is ``multipart/form-data``; parameters such as the
boundary are kept as sent), so every route compares media types one way.

:class:`RequestGuard` is the outermost layer of the app. For every HTTP request it

* answers a JSON 503 (``Retry-After``, connection closed) beyond ``max_requests`` requests in
  progress;
* reads the whole body first, with a limit (413 whether the size was declared or streamed in
  chunks; JSON bodies have their own, smaller one), an idle timeout between chunks (408: a
  body shorter than its ``Content-Length`` is answered, not waited on forever) and a budget
  for all bodies held at once (503 with ``Retry-After`` beyond it: many stalled large uploads
  cannot hold the memory);
* runs the app under the request deadline (504 when it passes; the scope's :data:`DEADLINE`
  tells a route when) and cancels it when the client
  disconnects, so that queued work whose caller is gone is dropped (see
  :mod:`themis_clip.batching`);
* answers any exception that escapes the app with the documented JSON 500 body, keeping the
  connection usable, and logs it with its traceback.

JSON bodies are parsed by the routes that take them (:mod:`.bodies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from themis_clip.server.errors import error_response

__all__ = [
    "DEADLINE",
    "BodyBudget",
    "FinishBody",
    "GuardLimits",
    "Observe",
    "RequestGuard",
    "StrictFraming",
]

log = logging.getLogger(__name__)

#: The scope key of the request's deadline (``time.monotonic()`` seconds): a route whose work
#: can stop part-way (reading text in pictures) stops before it and answers what it did.
DEADLINE = "themis.deadline"


@dataclass(frozen=True)
class GuardLimits:
    max_body_bytes: int = 20 * 2**20
    #: a JSON body's limit (images in bulk travel as raw or multipart bodies)
    max_json_bytes: int = 16 * 2**20
    body_idle_timeout_s: float = 10.0
    request_timeout_s: float = 30.0
    #: request-body bytes all requests together may hold (declared or received)
    max_bodies_in_flight_bytes: int = 256 * 2**20
    #: requests in progress at once (a JSON 503 beyond)
    max_requests: int = 1000


class BodyBudget:
    """Request-body bytes held at once, across requests (one event loop: no lock needed)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0

    def take(self, n: int) -> bool:
        if n > 0 and self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class _BudgetError(Exception):
    pass


class _ClosedError(Exception):
    """The client went away while sending its body."""


class RequestGuard:
    """The outermost layer: whole body read under limits, strict JSON, deadline, cancellation.

    ``on_event(name)`` counts what the guard did (``body_timeout``, ``disconnect``,
    ``deadline``, ``internal_error``, ``body_budget``, ``too_many_requests``) for the metrics.
    """

    def __init__(
        self,
        app: ASGIApp,
        limits: GuardLimits,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.app, self.limits = app, limits
        self.on_event = on_event or (lambda _: None)
        self.budget = BodyBudget(limits.max_bodies_in_flight_bytes)
        self.in_progress = 0  # requests this guard is handling (one event loop: no lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_progress >= self.limits.max_requests:
            self.on_event("too_many_requests")
            busy = error_response(
                503,
                "TooManyConnections",
                "too many requests in progress; retry",
                {"Retry-After": "1", "Connection": "close"},
            )
            await busy(scope, receive, send)
            return
        self.in_progress += 1
        held = [0]  # body bytes this request holds against the budget
        try:
            await self._handle(scope, receive, send, held)
        finally:
            self.in_progress -= 1
            self.budget.give(held[0])

    async def _handle(self, scope: Scope, receive: Receive, send: Send, held: list[int]) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        async def answer(status: int, kind: str, message: str, close: bool = False) -> None:
            headers = {"Connection": "close"} if close else None
            if status in (503, 429):
                headers = {**(headers or {}), "Retry-After": "1"}
            await error_response(status, kind, message, headers)(scope, receive, tracking_send)

        deadline = time.monotonic() + self.limits.request_timeout_s
        scope[DEADLINE] = deadline  # routes that can stop early read it
        try:
            body = await self._read_body(scope, receive, deadline, held)
        except _BudgetError as exc:
            self.on_event("body_budget")
            await answer(503, "ServerBusy", str(exc), close=True)
            return
        except _ClosedError:
            self.on_event("disconnect")
            return
        except _TooLargeError as exc:
            await answer(413, "PayloadTooLarge", str(exc), close=True)
            return
        except TimeoutError as exc:
            self.on_event("body_timeout")
            await answer(408, "RequestTimeout", str(exc), close=True)
            return

        disconnected = asyncio.Event()
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    return

        app_task = asyncio.ensure_future(self.app(scope, replay, tracking_send))
        watcher = asyncio.ensure_future(watch())
        try:
            remaining = max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait(
                {app_task, watcher}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if app_task in done:
                app_task.result()  # re-raise what the app raised
                return
            app_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await app_task
            if watcher in done:
                self.on_event("disconnect")  # nobody to answer: the work was cancelled
                return
            self.on_event("deadline")
            if not started:
                await answer(
                    504, "Timeout", f"request took longer than {self.limits.request_timeout_s} s"
                )
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            self.on_event("internal_error")
            if not started:
                await answer(500, "InternalError", "internal server error (logged on the server)")
        finally:
            watcher.cancel()
            if not app_task.done():
                app_task.cancel()

    def _take(self, n: int, held: list[int]) -> None:
        if not self.budget.take(n):
            raise _BudgetError(
                "the server holds too many request bodies at once "
                f"(over {self.budget.limit} bytes); retry"
            )
        held[0] += n

    async def _read_body(
        self, scope: Scope, receive: Receive, deadline: float, held: list[int]
    ) -> bytearray:
        """The whole body, grown a chunk at a time (a 20 MB ``b"".join`` at the end held the
        event loop for 5-30 ms: the copy and the page faults of fresh memory in one go)."""
        if _is_json(scope):
            limit = self.limits.max_json_bytes
            too_large = (
                f"JSON request body over {limit} bytes (send images in bulk as raw or "
                "multipart bodies: POST /embed/image)"
            )
        else:
            limit = self.limits.max_body_bytes
            too_large = f"request body over {limit} bytes"
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _TooLargeError(too_large)
        ceiling = int(declared) if declared is not None and declared.isdigit() else limit
        if declared is not None and declared.isdigit():
            # Reserved before a byte is buffered, but no more than RESERVED_AHEAD beyond what
            # has arrived: a client that declares 19 MB and sends a byte a second would
            # otherwise hold 19 MB of the budget for the whole request timeout.
            self._take(min(int(declared), RESERVED_AHEAD), held)
        body = bytearray()
        size = 0
        while True:
            idle = self.limits.body_idle_timeout_s
            left = min(idle, deadline - time.monotonic())
            try:
                message = await asyncio.wait_for(receive(), max(0.001, left))
            except TimeoutError:
                raise TimeoutError(
                    f"request body not received in time (more than {idle:g} s without data, "
                    f"or over {self.limits.request_timeout_s:g} s in all)"
                ) from None
            if message["type"] == "http.disconnect":
                raise _ClosedError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _TooLargeError(too_large)
            if size > held[0]:  # past the reservation: what arrived, and the next stretch
                self._take(size - held[0] + max(0, min(RESERVED_AHEAD, ceiling - size)), held)
            body += chunk
            if not message.get("more_body", False):
                return body


class _TooLargeError(Exception):
    pass


#: body bytes a request may hold against the budget beyond those it has sent
RESERVED_AHEAD = 1 << 20


def _is_json(scope: Scope) -> bool:
    content_type: bytes = dict(scope.get("headers") or []).get(b"content-type", b"")
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


class FinishBody:
    """Pure ASGI middleware, outermost: while the last piece of an answer is sent before the
    request body has ended, what still arrives of the body is taken and dropped.

    Hypercorn hands a body to the app through a short queue, and ends a request (closing the
    connection or readying it for the next) by queueing one more message for the app, inside
    the app's last ``send``: an answer given before the body is read (401, 413, 421) would
    otherwise wait on a full queue for ever. Taking messages lets that one in; the body is not
    read to its end, since the connection then closes.
    """

    def __init__(self, app: ASGIApp, idle_timeout_s: float) -> None:
        self.app, self.idle_timeout_s = app, idle_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ended = False

        async def tracking() -> Message:
            nonlocal ended
            message = await receive()
            ended = message["type"] == "http.disconnect" or not message.get("more_body", False)
            return message

        async def drop_the_rest() -> None:
            with contextlib.suppress(TimeoutError):
                while not ended:
                    await asyncio.wait_for(tracking(), self.idle_timeout_s)

        async def finishing(message: Message) -> None:
            last = message["type"] == "http.response.body" and not message.get("more_body")
            if not last or ended:
                await send(message)
                return
            dropping = asyncio.ensure_future(drop_the_rest())
            try:
                await send(message)
            finally:
                dropping.cancel()

        await self.app(scope, tracking, finishing)


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


#: headers a request may carry once (RFC 9110 5.3: a list syntax is needed to repeat one)
_SINGLE = (b"content-type", b"content-length", b"authorization", b"host")


class StrictFraming:
    """400 + close for ambiguous framing or repeated single-valued headers (see module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        names = [k for k, _ in headers]
        problem = None
        if b"transfer-encoding" in names and b"content-length" in names:
            problem = "both Content-Length and Transfer-Encoding: the framing is ambiguous"
        else:
            repeated = next((n for n in _SINGLE if names.count(n) > 1), None)
            if repeated is not None:
                problem = f"more than one {repeated.decode().title()} header"
        if problem is not None:
            response = error_response(400, "BadRequest", problem, {"Connection": "close"})
            await response(scope, receive, send)
            return
        coded = [
            v for k, v in headers if k == b"content-encoding" and v.strip().lower() != b"identity"
        ]
        if coded:  # RFC 9110 8.4.1: a coding the server does not apply is a 415
            name = coded[0].decode("latin-1").strip()[:40]
            response = error_response(
                415,
                "UnsupportedMediaType",
                f"Content-Encoding {name!r} is not supported: send the body uncompressed",
                {"Connection": "close", "Accept-Encoding": "identity"},
            )
            await response(scope, receive, send)
            return
        if b"content-type" in names:
            i = names.index(b"content-type")
            media, sep, params = headers[i][1].partition(b";")
            headers[i] = (b"content-type", media.strip().lower() + sep + params)
            scope["headers"] = headers  # in place: outer layers read what routing adds
        await self.app(scope, receive, send)
