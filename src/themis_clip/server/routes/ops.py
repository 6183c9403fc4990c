"""Health, readiness, statistics, Prometheus metrics and the search page."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from themis_clip.server.access import METRICS, PUBLIC
from themis_clip.server.bodies import JSONRoute
from themis_clip.server.errors import APIError
from themis_clip.server.page import ASSETS, SECURITY_HEADERS, asset, index_html
from themis_clip.server.schemas import Health, Readiness, Statistics, answer
from themis_clip.server.state import INDEX_HELD, AppState, StateDep

# no key: health, page
public = APIRouter(route_class=JSONRoute, dependencies=[PUBLIC], tags=["operations"])
router = APIRouter(route_class=JSONRoute, dependencies=[METRICS], tags=["operations"])


@public.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> Response:
    return Response(
        index_html(),
        media_type="text/html; charset=utf-8",
        headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"},
    )


@public.get("/static/{name}", include_in_schema=False)
async def static_asset(name: str) -> Response:
    data = asset(name)
    if data is None:
        raise APIError(404, "NotFound", f"no asset {name!r}")
    return Response(
        data,
        media_type=ASSETS[name],
        headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"},
    )


@public.get("/healthz", **answer(Health))
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@public.get("/readyz", **answer(Readiness))
async def readyz(state: StateDep) -> JSONResponse:
    ready = state.ready and state.plugin.is_ready()
    return JSONResponse(
        {"ready": ready, "model_id": state.model_id()}, status_code=200 if ready else 503
    )


#: statistics that can carry server paths or runtime messages: behind the admin token only
PRIVATE_STATS = ("last_reload_error", "loading_note")


def public_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """``stats`` without anything that names server paths or internals (errors become flags)."""
    out = {k: v for k, v in stats.items() if k not in PRIVATE_STATS}
    out["last_reload_failed"] = stats.get("last_reload_error") is not None
    report = stats.get("last_reload")
    if isinstance(report, dict) and report.get("error") is not None:
        out["last_reload"] = {**report, "error": "reload failed (details: GET /admin/stats)"}
    return out


@router.get("/stats", dependencies=[INDEX_HELD], **answer(Statistics))
async def stats(state: StateDep) -> dict[str, Any]:
    """Statistics for anyone who can reach the service: no paths, no runtime messages."""
    out = public_stats(full_stats(state))
    out["migration"] = state.migration_status(private=False)
    return out


def full_stats(state: AppState) -> dict[str, Any]:
    out = state.plugin.get_statistics()
    out["server"] = {
        "ready": state.ready,
        "uptime_s": time.monotonic() - state.started,
        "image_queue_depth": state.image_batcher.depth if state.image_batcher else 0,
        "text_queue_depth": state.text_batcher.depth if state.text_batcher else 0,
        "image_batches": state.image_batcher.stats.batches if state.image_batcher else 0,
        "index_items": state.index.store.count() if state.index else None,
        "image_items_skipped": state.image_batcher.stats.skipped if state.image_batcher else 0,
        "text_items_skipped": state.text_batcher.stats.skipped if state.text_batcher else 0,
    }
    out["migration"] = state.migration_status()
    return out


@router.get("/metrics", include_in_schema=False)
async def metrics(state: StateDep) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
