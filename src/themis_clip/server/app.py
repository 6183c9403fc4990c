"""The HTTP service: ``create_app(settings)`` assembles a FastAPI app around one plugin.

The factory only assembles: state (:mod:`.state`), middleware (:mod:`.middleware`), metrics
(:mod:`.metrics`), the error table (:mod:`.errors`) and one router per resource
(:mod:`.routes`: ``ops``, ``embeddings``, ``search``, ``classify``, ``admin``, ``dialects``).
Endpoints: ``POST /v1/embeddings``,
``GET /v1/models`` (OpenAI-compatible), ``POST /v1/classify``, ``POST /embed/image``, ``POST
/embed/text``, ``POST /index/items``, ``POST /search``, ``GET /index/info``, ``GET
/index/filters``, ``GET /items/{id}`` (and ``/thumbnail``, ``/preview``), ``GET /healthz``,
``GET /readyz``, ``GET /stats``, ``GET /metrics``, ``POST /admin/reload``, ``GET
/admin/stats``, ``GET``/``POST /admin/migrate`` (and ``/admin/migrate/{action}``), ``GET /``
(search page); other services' embedding APIs (immich's ``GET
/ping`` and ``POST /predict``, Ollama's ``POST /api/embed``, TEI's ``POST /embed``, Cohere's
``POST /v2/embed``); OpenAPI at ``/docs`` (``/redoc`` redirects there). Concurrent
single-item requests are coalesced by :class:`MicroBatcher`; all model and index work runs in
threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import FastAPI

from themis_clip._version import __version__
from themis_clip.batching import MicroBatcher
from themis_clip.loading import load_ocr
from themis_clip.ocr import OCREngine
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.server.access import (
    Authenticate,
    TrustedHosts,
    network_routes,
    parse_networks,
    route_scopes,
)
from themis_clip.server.auth import KeyStore
from themis_clip.server.errors import install_error_handlers
from themis_clip.server.metrics import Metrics, lag_period, watch_loop_lag
from themis_clip.server.middleware import (
    FinishBody,
    GuardLimits,
    Observe,
    RequestGuard,
    StrictFraming,
)
from themis_clip.server.routes import (
    admin,
    classify,
    dialects,
    docs,
    duplicates,
    embeddings,
    migrate,
    ops,
    search,
)
from themis_clip.server.schemas import ERRORS
from themis_clip.server.settings import ServerSettings
from themis_clip.server.state import AppState, open_index, text_batch_fn

__all__ = ["ServerSettings", "create_app"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_R = TypeVar("_R")


def create_app(
    settings: ServerSettings,
    *,
    plugin: OnnxClipPlugin | None = None,
    ocr: OCREngine | None = None,
) -> FastAPI:
    """Build the service. The plugin, and with an index the OCR engine its config enables,
    are opened in the app's lifespan (startup) unless given (``themis-clip serve`` opens them
    first, so a bad model is one message, not a traceback)."""
    metrics = Metrics()
    state = AppState(settings=settings, plugin=plugin or OnnxClipPlugin(), metrics=metrics, ocr=ocr)
    metrics.track_queue(
        "image",
        lambda: state.image_batcher.depth if state.image_batcher else 0,
        lambda: state.image_batcher.stats.skipped if state.image_batcher else 0,
    )
    metrics.track_queue(
        "text",
        lambda: state.text_batcher.depth if state.text_batcher else 0,
        lambda: state.text_batcher.stats.skipped if state.text_batcher else 0,
    )

    metrics.track_migration(
        lambda: state.migration.control.snapshot() if state.migration is not None else None
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
                on_batch=lambda n: metrics.batch_sizes.labels(modality).observe(n),
                dispatch_when_idle=True,
            )

        state.image_batcher = batcher(p.generate_embedding_batch, "image")
        state.text_batcher = batcher(text_batch_fn(p), "text")
        if settings.index_path:
            state.index = await asyncio.to_thread(open_index, settings)
            if settings.plugin_config.ocr.enabled and state.ocr is None:
                state.ocr = await asyncio.to_thread(
                    load_ocr, settings.plugin_config, budget=p.pixel_budget
                )
            if state.index.store.kind == "postgresql" and state.index.mode == "exact":
                log.warning(
                    "the index at %s has no pgvector HNSW index yet: searches scan every row "
                    "(`themis-clip index` builds it)",
                    state.index.store.path,
                )
        lag = asyncio.create_task(watch_loop_lag(metrics.loop_lag.observe, lag_period(metrics)))
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
            lag.cancel()
            await migrate.stop(state)  # the shadow is kept: a POST after a restart resumes
            # The server has answered or dropped every request by now: nothing waits for the
            # runs still going (a warm-up, an abandoned batch), so they are stopped, not drained.
            await asyncio.to_thread(p.shutdown, 0.0)
            if warm is not None and not warm.done():
                await asyncio.gather(warm, return_exceptions=True)
            await state.image_batcher.close()
            await state.text_batcher.close()
            if state.index is not None:
                state.index.close()
            if state.ocr is not None:
                state.ocr.close()

    app = FastAPI(
        title="themis-clip",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,  # served offline by routes/docs.py, under the page's CSP
        redoc_url=None,
        description="CLIP image and text embeddings and multi-modal search on ONNX Runtime",
        openapi_tags=docs.TAGS,
        responses=ERRORS,
    )
    app.openapi = docs.markdown_openapi(app)  # type: ignore[method-assign]
    app.state.themis = state
    # Requests are matched against the routes in this order, each router in turn: the
    # embedding routes, the ones called per photo or per query, come first.
    routers = [embeddings.router, dialects.immich, dialects.router]
    routers += [m.router for m in (ops, search, classify, admin, migrate, docs, duplicates)]
    routers += [ops.public, search.writes, dialects.public]
    for router in routers:
        app.include_router(router)
    # Outermost last: FinishBody > Observe > TrustedHosts > StrictFraming > Authenticate >
    # RequestGuard, so that nothing reads a body before the host, the framing and the key are
    # checked.
    app.add_middleware(
        RequestGuard,
        limits=GuardLimits(
            max_body_bytes=settings.max_body_bytes,
            max_json_bytes=settings.max_json_bytes,
            body_idle_timeout_s=settings.body_idle_timeout_s,
            request_timeout_s=settings.request_timeout_s,
            max_bodies_in_flight_bytes=settings.max_bodies_in_flight_bytes,
            max_requests=settings.max_requests,
        ),
        on_event=lambda name: metrics.guard_events.labels(name).inc(),
    )
    open_docs = (app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
    all_routes = [*app.routes, *(r for router in routers for r in router.routes)]
    app.add_middleware(
        Authenticate,
        keys=KeyStore(settings.keys_file, admin_token=settings.admin_token),
        routes=route_scopes(all_routes, [p for p in open_docs if p]),
        by_network=network_routes(all_routes),
        networks=parse_networks(settings.immich_from),
    )
    app.add_middleware(StrictFraming)
    if settings.allowed_hosts is not None:
        app.add_middleware(TrustedHosts, allowed=settings.allowed_hosts)
    app.add_middleware(Observe, record=metrics.observe)  # the guard's answers count
    app.add_middleware(FinishBody, idle_timeout_s=settings.body_idle_timeout_s)  # outermost
    install_error_handlers(app, metrics, settings.request_timeout_s)
    return app
