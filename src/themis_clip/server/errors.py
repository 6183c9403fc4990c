"""Errors → HTTP: one status table, one JSON body ``{"error": {"type", "message"}}``.

Every failure the service answers goes through :func:`status_for` (exceptions raised by the
library, and ``EmbeddingResult.error_type`` names, which are those exceptions' class names),
or is an :class:`APIError` that carries its own status.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from themis_clip import errors as library_errors
from themis_clip.batching import QueueFullError
from themis_clip.errors import (
    ConfigError,
    ImageTooLargeError,
    IndexModelMismatchError,
    InputError,
    ModelError,
    NotReadyError,
    RequestTooLargeError,
    ResourceBusyError,
    SearchIndexError,
    ThemisClipError,
)
from themis_clip.server.metrics import Metrics

log = logging.getLogger(__name__)

__all__ = [
    "APIError",
    "error_response",
    "install_error_handlers",
    "retry_headers",
    "status_for",
    "status_for_name",
]


class APIError(Exception):
    """An error answered as is: status, type name, message, optional headers."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        headers: dict[str, str] | None = None,
        *,
        fields: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = (
            status,
            error_type,
            message,
            headers,
        )
        self.fields = fields or {}  # more keys of the error object (OpenAI's code and param)


# The one table: most specific first. A ConfigError reaching a client is about what the
# client asked for (a model without a text tower, an option the model cannot honour): 422.
STATUS: list[tuple[type[BaseException], int]] = [
    (ImageTooLargeError, 413),
    (RequestTooLargeError, 413),
    (InputError, 422),
    (QueueFullError, 429),
    (NotReadyError, 503),
    (ResourceBusyError, 503),
    (IndexModelMismatchError, 409),
    (SearchIndexError, 503),
    (ConfigError, 422),
    (ModelError, 422),
    (TimeoutError, 504),
    (ThemisClipError, 500),
]


def status_for(exc: BaseException) -> int:
    return next((code for cls, code in STATUS if isinstance(exc, cls)), 500)


def _classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {"QueueFullError": QueueFullError}
    for name in library_errors.__all__:
        found[name] = getattr(library_errors, name)
    return found


_BY_NAME = _classes()


def status_for_name(error_type: str | None) -> int:
    """The status of an ``EmbeddingResult.error_type`` (a library exception's class name)."""
    cls = _BY_NAME.get(error_type or "")
    return next((code for c, code in STATUS if cls is not None and issubclass(cls, c)), 500)


def retry_headers(status: int) -> dict[str, str] | None:
    """``Retry-After`` for statuses a retry can clear (429 and 503)."""
    return {"Retry-After": "1"} if status in (429, 503) else None


def error_response(
    status: int,
    error_type: str,
    message: str,
    headers: dict[str, str] | None = None,
    fields: dict[str, Any] | None = None,
) -> JSONResponse:
    body = {"type": error_type, "message": message, **(fields or {})}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def validation_message(errors: list[Any]) -> tuple[int, str, str]:
    """Status, type and message for pydantic's error list (the first error, by location)."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        detail = str(first.get("ctx", {}).get("error", ""))
        return 400, "BadJSON", f"request body is not valid JSON: {detail}".rstrip(": ")
    where = ".".join(str(x) for x in first.get("loc", ()))
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else "invalid request body"
    return 422, "ValidationError", message


def route_of(request: Request) -> str:
    return str(getattr(request.scope.get("route"), "path", "unmatched"))


def install_error_handlers(app: FastAPI, metrics: Metrics, request_timeout_s: float) -> None:
    """Translate every error once, here, into the documented JSON body and status."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        metrics.errors.labels(route_of(request), exc.error_type).inc()
        return error_response(exc.status, exc.error_type, exc.message, exc.headers, exc.fields)

    @app.exception_handler(ThemisClipError)
    async def themis_error(request: Request, exc: ThemisClipError) -> JSONResponse:
        headers = (
            {"Retry-After": str(math.ceil(exc.retry_after_s))}
            if isinstance(exc, QueueFullError)
            else retry_headers(status_for(exc))
        )
        metrics.errors.labels(route_of(request), type(exc).__name__).inc()
        message = str(exc)
        if isinstance(exc, SearchIndexError) and not isinstance(exc, IndexModelMismatchError):
            # A store's own errors name where it lives (a database URL: user, socket folder,
            # database; a file path): logged here, never answered.
            log.warning("search index error on %s: %s", route_of(request), message)
            message = "the search index cannot be used right now (the cause is in the server log)"
        return error_response(status_for(exc), type(exc).__name__, message, headers)

    @app.exception_handler(TimeoutError)
    async def timeout_error(request: Request, exc: TimeoutError) -> JSONResponse:
        metrics.errors.labels(route_of(request), "Timeout").inc()
        return error_response(504, "Timeout", f"request took longer than {request_timeout_s} s")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = list(exc.errors())
        status, kind, message = validation_message(problems)
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        whole_body = any(tuple(p.get("loc", ())) == ("body",) for p in problems)
        if whole_body and media != "application/json" and not media.endswith("+json"):
            shown = repr(media[:60]) if media else "none"
            message += (
                f" (the body is read as JSON only with Content-Type: application/json; "
                f"this request's Content-Type is {shown})"
            )
        metrics.errors.labels(route_of(request), kind).inc()
        return error_response(status, kind, message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        return error_response(exc.status_code, kind, str(exc.detail))
