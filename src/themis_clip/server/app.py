"""The HTTP service: ``create_app(settings)`` builds a FastAPI app around one plugin.

Endpoints: ``POST /v1/embeddings`` (OpenAI-compatible, ``modality`` text or image),
``POST /embed/image`` (raw bytes or multipart), ``POST /embed/text``, ``POST /index/items``,
``POST /search``, ``GET /items/{id}/thumbnail``, ``GET /healthz``, ``GET /readyz``,
``GET /stats``, ``GET /metrics``, ``POST /admin/reload``, ``GET /`` (search page); OpenAPI at
``/docs``. Concurrent single-item requests are coalesced by :class:`MicroBatcher`; all model and
index work runs in worker threads. Errors are translated here, once, into JSON bodies
``{"error": {"type": ..., "message": ...}}`` with the right status.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from themis_clip._version import __version__
from themis_clip.batching import MicroBatcher, QueueFullError
from themis_clip.config import PluginConfig
from themis_clip.errors import (
    ConfigError,
    ImageTooLargeError,
    IndexModelMismatchError,
    InputError,
    ModelError,
    NotReadyError,
    SearchIndexError,
    ThemisClipError,
)
from themis_clip.index.search import ModelStamp, VectorIndex
from themis_clip.index.store import ItemRow
from themis_clip.interface import EmbeddingResult
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.preprocess.image import make_thumbnail
from themis_clip.server.page import PAGE
from themis_clip.server.schemas import (
    IndexItemsRequest,
    OpenAIEmbeddingsRequest,
    ReloadRequest,
    SearchRequest,
    TextRequest,
)

__all__ = ["ServerSettings", "create_app"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """What the service needs; the CLI builds it from flags, config and environment.

    Attributes:
        plugin_config: the model to serve.
        index_path: SQLite index for ``/search`` and ``/index/items`` (None: search disabled).
        model_root: folder that ``/admin/reload`` paths must stay inside (None: reload disabled).
        admin_token: bearer token for ``/admin/*`` (None: admin endpoints disabled).
        max_body_bytes: larger request bodies get 413.
        max_queue: waiting items per batcher before 429.
        max_queue_delay_ms: how long a request waits for its batch to fill.
        request_timeout_s: per-request limit (504 beyond it).
        warmup: run ``plugin.warmup()`` before ``/readyz`` turns ready.
    """

    plugin_config: PluginConfig
    index_path: str | None = None
    model_root: str | None = None
    admin_token: str | None = None
    max_body_bytes: int = 20 * 2**20
    max_queue: int = 512
    max_queue_delay_ms: float = 5.0
    request_timeout_s: float = 30.0
    warmup: bool = True


class APIError(Exception):
    def __init__(
        self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = (
            status,
            error_type,
            message,
            headers,
        )


# Statuses for EmbeddingResult.error_type and raised ThemisClipErrors, most specific first.
_STATUS: list[tuple[type[BaseException], int]] = [
    (ImageTooLargeError, 413),
    (InputError, 422),
    (QueueFullError, 429),
    (NotReadyError, 503),
    (IndexModelMismatchError, 409),
    (SearchIndexError, 503),
    (ConfigError, 400),
    (ModelError, 422),
    (TimeoutError, 504),
    (ThemisClipError, 500),
]
_STATUS_BY_NAME = {
    "ImageDecodeError": 422,
    "ImageTooLargeError": 413,
    "InputError": 422,
    "TextInputError": 422,
    "NotReadyError": 503,
    "ConfigError": 422,
    "InferenceError": 500,
}


def _error_response(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"type": error_type, "message": message}}, status_code=status, headers=headers
    )


class _BodyLimit:
    """Pure ASGI middleware: 413 for bodies over the limit, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = _error_response(413, "PayloadTooLarge", f"request body over {self.limit} bytes")
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


class _Observe:
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


@dataclass
class _State:
    settings: ServerSettings
    plugin: OnnxClipPlugin
    registry: CollectorRegistry
    ready: bool = False
    index: VectorIndex | None = None
    index_lock: threading.Lock = field(default_factory=threading.Lock)
    image_batcher: MicroBatcher[bytes, EmbeddingResult] | None = None
    text_batcher: MicroBatcher[str, EmbeddingResult] | None = None
    started: float = field(default_factory=time.monotonic)


def _decode_image_field(value: str) -> bytes:
    """Bytes from a data URL or bare base64; URLs are refused (the server never fetches)."""
    if value.startswith(("http://", "https://", "file:", "ftp://")):
        raise APIError(
            400,
            "URLNotAllowed",
            "image URLs are not fetched by this server; send a base64 data URL",
        )
    payload = value
    if value.startswith("data:"):
        header, sep, payload = value.partition(",")
        if not sep or ";base64" not in header:
            raise APIError(400, "BadDataURL", "image data URL must be 'data:<type>;base64,<data>'")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "BadBase64", "image is not valid base64") from None
    if not data:
        raise APIError(422, "ImageDecodeError", "empty image data (0 bytes)")
    return data


def _raise_for(result: EmbeddingResult, what: str = "input") -> None:
    if not result.ok:
        status = _STATUS_BY_NAME.get(result.error_type or "", 500)
        raise APIError(status, result.error_type or "Error", f"{what}: {result.error}")


def _vector(result: EmbeddingResult) -> list[float]:
    assert result.embedding is not None
    return [float(v) for v in result.embedding]


def create_app(settings: ServerSettings, *, plugin: OnnxClipPlugin | None = None) -> FastAPI:
    """Build the service. The plugin is initialised in the app's lifespan (startup)."""
    registry = CollectorRegistry()
    state = _State(settings=settings, plugin=plugin or OnnxClipPlugin(), registry=registry)
    requests = Counter("themis_requests", "HTTP requests", ["route", "status"], registry=registry)
    errors = Counter(
        "themis_request_errors", "HTTP requests that failed", ["route", "type"], registry=registry
    )
    latency = Histogram(
        "themis_request_seconds",
        "request latency",
        ["route"],
        registry=registry,
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    )
    batch_sizes = Histogram(
        "themis_batch_size",
        "items per model batch",
        ["modality"],
        registry=registry,
        buckets=(1, 2, 4, 8, 16, 32, 64, 128),
    )
    queue_depth = Gauge(
        "themis_queue_depth", "items waiting for a batch", ["modality"], registry=registry
    )
    queue_depth.labels("image").set_function(
        lambda: state.image_batcher.depth if state.image_batcher else 0
    )
    queue_depth.labels("text").set_function(
        lambda: state.text_batcher.depth if state.text_batcher else 0
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        p = state.plugin
        if not p.is_ready() and not await asyncio.to_thread(p.initialize, settings.plugin_config):
            raise RuntimeError(f"cannot load the model: {p.last_error}")

        def batcher(fn: Callable[[list[_T]], Sequence[_R]], modality: str) -> MicroBatcher[_T, _R]:
            return MicroBatcher(
                fn,
                max_batch_size=settings.plugin_config.max_batch_size,
                max_queue_delay_ms=settings.max_queue_delay_ms,
                max_queue=settings.max_queue,
                on_batch=lambda n: batch_sizes.labels(modality).observe(n),
            )

        state.image_batcher = batcher(p.generate_embedding_batch, "image")
        state.text_batcher = batcher(p.generate_text_embedding_batch, "text")
        if settings.index_path:
            state.index = await asyncio.to_thread(
                VectorIndex, settings.index_path, background_build=True
            )
        warm: asyncio.Task[None] | None = None
        if settings.warmup:

            async def warm_up() -> None:
                await asyncio.to_thread(p.warmup)
                state.ready = True
                log.info("warmup finished: ready")

            warm = asyncio.create_task(warm_up())
        else:
            state.ready = True
        try:
            yield
        finally:
            state.ready = False
            if warm is not None and not warm.done():
                await asyncio.gather(warm, return_exceptions=True)
            await state.image_batcher.close()
            await state.text_batcher.close()
            await asyncio.to_thread(p.shutdown)
            if state.index is not None:
                state.index.close()

    app = FastAPI(
        title="themis-clip",
        version=__version__,
        lifespan=lifespan,
        description="CLIP image and text embeddings and multi-modal search on ONNX Runtime",
    )
    app.state.themis = state

    def observe(route: str, status: int, seconds: float) -> None:
        requests.labels(route, str(status)).inc()
        latency.labels(route).observe(seconds)

    app.add_middleware(_Observe, record=observe)
    app.add_middleware(_BodyLimit, limit=settings.max_body_bytes)

    # -- errors: translated once, here ---------------------------------------------------------

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        errors.labels(_route(request), exc.error_type).inc()
        return _error_response(exc.status, exc.error_type, exc.message, exc.headers)

    @app.exception_handler(ThemisClipError)
    async def themis_error(request: Request, exc: ThemisClipError) -> JSONResponse:
        status = next(code for cls, code in _STATUS if isinstance(exc, cls))
        headers = (
            {"Retry-After": str(int(np.ceil(exc.retry_after_s)))}
            if isinstance(exc, QueueFullError)
            else None
        )
        errors.labels(_route(request), type(exc).__name__).inc()
        return _error_response(status, type(exc).__name__, str(exc), headers)

    @app.exception_handler(TimeoutError)
    async def timeout_error(request: Request, exc: TimeoutError) -> JSONResponse:
        errors.labels(_route(request), "Timeout").inc()
        return _error_response(
            504, "Timeout", f"request took longer than {settings.request_timeout_s} s"
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            errors.labels(_route(request), "BadJSON").inc()
            return _error_response(
                400,
                "BadJSON",
                f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(
                    ": "
                ),
            )
        where = ".".join(str(x) for x in first.get("loc", ()))
        message = (
            f"{where}: {first.get('msg', 'invalid request')}" if where else "invalid request body"
        )
        errors.labels(_route(request), "ValidationError").inc()
        return _error_response(422, "ValidationError", message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        return _error_response(exc.status_code, kind, str(exc.detail))

    # -- helpers -------------------------------------------------------------------------------

    def require_ready() -> OnnxClipPlugin:
        if not state.plugin.is_ready():
            raise NotReadyError("the model is not loaded")
        return state.plugin

    async def embed_image(data: bytes) -> EmbeddingResult:
        require_ready()
        assert state.image_batcher is not None
        return await state.image_batcher.submit(data, timeout_s=settings.request_timeout_s)

    async def embed_text(text: str) -> EmbeddingResult:
        require_ready()
        assert state.text_batcher is not None
        return await state.text_batcher.submit(text, timeout_s=settings.request_timeout_s)

    async def embed_all(
        items: list[Any], one: Callable[[Any], Awaitable[EmbeddingResult]]
    ) -> list[EmbeddingResult]:
        """Embed a request's items, all by one model (re-run when a hot swap split them)."""
        results: list[EmbeddingResult] = []
        for _ in range(3):
            results = list(await asyncio.gather(*(one(x) for x in items)))
            if len({r.model_id for r in results if r.ok}) <= 1:
                break
        return results

    def model_id() -> str | None:
        identity = state.plugin.model_identity
        return identity.model_id if identity else None

    def index() -> VectorIndex:
        if state.index is None:
            raise APIError(404, "NoIndex", "this server has no index (start it with --index PATH)")
        return state.index

    def stamp() -> ModelStamp:
        identity = state.plugin.model_identity
        if identity is None:
            raise NotReadyError("the model is not loaded")
        return ModelStamp(
            model_id=identity.model_id, sha256=identity.sha256, dim=identity.embedding_dim
        )

    # -- routes --------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> str:
        return PAGE

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready = state.ready and state.plugin.is_ready()
        return JSONResponse(
            {"ready": ready, "model_id": model_id()}, status_code=200 if ready else 503
        )

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        out = state.plugin.get_statistics()
        out["server"] = {
            "ready": state.ready,
            "uptime_s": time.monotonic() - state.started,
            "image_queue_depth": state.image_batcher.depth if state.image_batcher else 0,
            "text_queue_depth": state.text_batcher.depth if state.text_batcher else 0,
            "image_batches": state.image_batcher.stats.batches if state.image_batcher else 0,
            "index_items": state.index.store.count() if state.index else None,
        }
        return out

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/embeddings")
    async def openai_embeddings(body: OpenAIEmbeddingsRequest) -> dict[str, Any]:
        inputs = [body.input] if isinstance(body.input, str) else body.input
        if not inputs:
            raise APIError(422, "ValidationError", "input: at least one item is required")
        if len(inputs) > 2048:
            raise APIError(422, "ValidationError", "input: at most 2048 items")
        if body.modality == "image":
            results = await embed_all([_decode_image_field(x) for x in inputs], embed_image)
        else:
            results = await embed_all(list(inputs), embed_text)
        for i, r in enumerate(results):
            _raise_for(r, f"input[{i}]")
        rows = []
        for i, r in enumerate(results):
            assert r.embedding is not None
            value: Any = (
                base64.b64encode(r.embedding.astype("<f4").tobytes()).decode()
                if body.encoding_format == "base64"
                else _vector(r)
            )
            rows.append({"object": "embedding", "index": i, "embedding": value})
        return {
            "object": "list",
            "data": rows,
            "model": results[0].model_id,
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }

    @app.post("/embed/image")
    async def embed_image_route(request: Request) -> dict[str, Any]:
        content_type = request.headers.get("content-type", "")
        if content_type.startswith("multipart/form-data"):
            form = await request.form()
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise APIError(422, "ValidationError", "multipart body needs a 'file' field")
            data = await upload.read()
        else:
            data = await request.body()
        if not data:
            raise APIError(422, "ImageDecodeError", "empty image data (0 bytes)")
        result = await embed_image(data)
        _raise_for(result, "image")
        return {
            "embedding": _vector(result),
            "dim": len(_vector(result)),
            "model_id": result.model_id,
            "latency_ms": result.latency_ms,
        }

    @app.post("/embed/text")
    async def embed_text_route(body: TextRequest) -> dict[str, Any]:
        if (body.text is None) == (body.texts is None):
            raise APIError(422, "ValidationError", "give exactly one of 'text' or 'texts'")
        texts = [body.text] if body.text is not None else list(body.texts or [])
        if not texts:
            raise APIError(422, "ValidationError", "texts: at least one text is required")
        results = await embed_all(texts, embed_text)
        for i, r in enumerate(results):
            _raise_for(r, f"texts[{i}]")
        return {
            "embeddings": [_vector(r) for r in results],
            "truncated": [r.truncated for r in results],
            "model_id": results[0].model_id,
        }

    @app.post("/index/items")
    async def index_items(body: IndexItemsRequest) -> dict[str, Any]:
        idx = index()
        data = [_decode_image_field(item.image) for item in body.items]
        results = await embed_all(data, embed_image)
        for item, r in zip(body.items, results, strict=True):
            _raise_for(r, f"item {item.id!r}")
        thumbs = await asyncio.to_thread(lambda: [make_thumbnail(d) for d in data])
        rows = [
            ItemRow(key=item.id, vector=r.embedding, metadata=item.metadata, thumbnail=t)  # type: ignore[arg-type]
            for item, r, t in zip(body.items, results, thumbs, strict=True)
        ]
        current = stamp()
        if results[0].model_id != current.model_id:  # swapped between embedding and now
            raise APIError(
                503,
                "ModelChanged",
                "the model was swapped during this request; retry",
                headers={"Retry-After": "1"},
            )

        def write() -> None:
            with state.index_lock:
                idx.bind_model(current)
                idx.store.upsert(rows, dim=current.dim)

        await asyncio.to_thread(write)
        return {"added": len(rows), "ids": [r.key for r in rows], "model_id": current.model_id}

    @app.post("/search")
    async def search(body: SearchRequest) -> dict[str, Any]:
        idx = index()
        given = [x is not None for x in (body.text, body.image, body.vector)]
        if sum(given) != 1:
            raise APIError(
                422, "ValidationError", "give exactly one of 'text', 'image' or 'vector'"
            )
        if body.vector is not None:
            query = np.asarray(body.vector, dtype=np.float32)
            norm = float(np.linalg.norm(query))
            if not np.isfinite(norm) or norm == 0:
                raise APIError(422, "ValidationError", "vector must be finite and non-zero")
            query /= norm
            current = stamp()
        else:
            for _ in range(3):  # the query and the index check must see the same model
                result = await (
                    embed_text(body.text)
                    if body.text is not None
                    else embed_image(_decode_image_field(body.image or ""))
                )
                _raise_for(result, "query")
                current = stamp()
                if result.model_id == current.model_id:
                    break
            assert result.embedding is not None
            query = result.embedding

        def run() -> tuple[list[Any], str]:
            with state.index_lock:
                if idx.stamp is not None:
                    idx.bind_model(current)  # 409 when the index was built by another model
                return idx.search(query, body.k, body.filters), idx.mode

        hits, mode = await asyncio.to_thread(run)
        return {
            "results": [
                {
                    "id": h.key,
                    "score": h.score,
                    "path": h.path,
                    "metadata": h.metadata,
                    "thumbnail": f"/items/{_quote(h.key)}/thumbnail",
                }
                for h in hits
            ],
            "model_id": current.model_id,
            "mode": mode,
        }

    @app.get("/items/{key:path}/thumbnail")
    async def thumbnail(key: str) -> Response:
        idx = index()

        def load() -> bytes | None:
            with state.index_lock:
                item = idx.store.get(key)
                stored = idx.store.thumbnail(key) if item else None
            if item is None:
                return None
            if stored is not None:
                return stored
            # Only files the index itself recorded are ever read: never a path from the request.
            return make_thumbnail(Path(item.path)) if item.path else None

        try:
            data = await asyncio.to_thread(load)
        except InputError as exc:
            raise APIError(404, "NotFound", f"no preview for {key!r}: {exc}") from exc
        if data is None:
            raise APIError(404, "NotFound", f"no item {key!r}")
        return Response(data, media_type="image/jpeg", headers={"Cache-Control": "max-age=3600"})

    @app.post("/admin/reload")
    async def admin_reload(request: Request, body: ReloadRequest) -> dict[str, Any]:
        _check_token(request, settings.admin_token)
        if not settings.model_root:
            raise APIError(
                403, "Forbidden", "model reload is disabled (start the server with --model-root)"
            )
        target = _inside_root(settings.model_root, body.path)
        base = settings.plugin_config
        model_changes: dict[str, Any] = {
            "path": str(target),
            "variant": body.variant,
            "expected_sha256": body.expected_sha256,
            "name": None,
            "embedding_dim": None,
        }
        if body.enable_mmap_loading is not None:
            model_changes["enable_mmap_loading"] = body.enable_mmap_loading
        new_config = replace(
            base,
            model=replace(base.model, **model_changes),
            allow_embedding_space_change=body.allow_embedding_space_change,
        )
        ok = await asyncio.to_thread(state.plugin.reload_model, new_config)
        if not ok:
            raise APIError(422, "ReloadFailed", state.plugin.last_error or "reload failed")
        return {
            "reloaded": True,
            "model_id": model_id(),
            "generation": state.plugin.get_statistics()["generation"],
        }

    return app


def _route(request: Request) -> str:
    return str(getattr(request.scope.get("route"), "path", "unmatched"))


def _quote(key: str) -> str:
    from urllib.parse import quote

    return quote(key, safe="")


def _check_token(request: Request, token: str | None) -> None:
    if not token:
        raise APIError(403, "Forbidden", "admin endpoints are disabled (no admin token configured)")
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise APIError(
            401,
            "Unauthorized",
            "admin endpoints need 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(given.encode(), token.encode()):  # constant time
        raise APIError(403, "Forbidden", "wrong admin token")


def _inside_root(root: str, requested: str) -> Path:
    """Resolve ``requested`` against ``root`` (symlinks followed); refuse anything outside it."""
    base = Path(root).resolve()
    target = (base / requested).resolve()
    if target != base and base not in target.parents:
        raise APIError(403, "Forbidden", f"model path {requested!r} is outside the model root")
    return target
