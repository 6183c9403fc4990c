"""The index: add items, search by text, image or vector, item thumbnails."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import Response

from themis_clip.errors import InputError
from themis_clip.index.metadata import validate_metadata
from themis_clip.index.stores import Facets, ItemRow, Lexical
from themis_clip.preprocess.thumbnail import KEPT_PREVIEW, fit_preview, make_thumbnail
from themis_clip.server.access import SEARCH, WRITE
from themis_clip.server.bodies import JSONRoute, documented, json_body
from themis_clip.server.errors import APIError
from themis_clip.server.middleware import DEADLINE
from themis_clip.server.payloads import check_key, decode_image_fields, raise_for
from themis_clip.server.querying import run_search
from themis_clip.server.schemas import (
    IndexInfo,
    IndexItemsRequest,
    Item,
    ItemsAdded,
    MetadataKeys,
    SearchRequest,
    SearchResults,
    answer,
)
from themis_clip.server.state import INDEX_HELD, AppState, StateDep

router = APIRouter(route_class=JSONRoute, dependencies=[SEARCH, INDEX_HELD], tags=["index"])
# ingest needs no search
writes = APIRouter(route_class=JSONRoute, dependencies=[WRITE, INDEX_HELD], tags=["index"])


@writes.post("/index/items", openapi_extra=documented(IndexItemsRequest), **answer(ItemsAdded))
async def index_items(
    body: Annotated[IndexItemsRequest, json_body(IndexItemsRequest)],
    state: StateDep,
    request: Request,
) -> dict[str, Any]:
    """Embed and store the items; with OCR on, then read their text while the request's
    deadline allows (``text_unread``: items stored without it, read by a later re-post)."""
    idx = state.require_index()
    seen: dict[str, int] = {}
    for i, item in enumerate(body.items):
        check_key(item.id, f"items[{i}].id", new=True)
        if item.id in seen:
            raise APIError(
                422,
                "ValidationError",
                f"items[{i}].id: {item.id!r} repeats items[{seen[item.id]}].id; ids in one "
                "request must be unique",
            )
        seen[item.id] = i
        validate_metadata(item.metadata, where=f"items[{i}].metadata")
    data = await decode_image_fields([item.image for item in body.items])
    results = await state.embed_images(data)
    for item, r in zip(body.items, results, strict=True):
        raise_for(r, f"item {item.id!r}")
    budget = state.plugin.pixel_budget
    max_pixels = state.settings.plugin_config.preprocess.max_image_pixels
    # Kept large enough to re-embed the item with another model (it has no file); decoded
    # within the same pixel budget as embeddings.
    thumbs = await asyncio.to_thread(
        lambda: [
            make_thumbnail(d, size=KEPT_PREVIEW, budget=budget, max_image_pixels=max_pixels)
            for d in data
        ]
    )
    rows = [
        ItemRow(key=item.id, vector=r.embedding, metadata=item.metadata, thumbnail=t)  # type: ignore[arg-type]
        for item, r, t in zip(body.items, results, thumbs, strict=True)
    ]
    current = state.stamp()
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

    await asyncio.to_thread(write)  # stored first: reading text cannot lose them
    added: dict[str, Any] = {
        "added": len(rows),
        "ids": [r.key for r in rows],
        "model_id": current.model_id,
    }
    if state.ocr is not None and isinstance(idx.store, Lexical):
        # The text in each picture (decoded again, at OCR's size), within the deadline.
        deadline = request.scope.get(DEADLINE, time.monotonic() + state.settings.request_timeout_s)
        pictures = [(item.id, d) for item, d in zip(body.items, data, strict=True)]
        readings = await state.read_texts(pictures, deadline)
        store = idx.store

        def write_text() -> None:
            with state.index_lock:
                store.set_ocr(readings)

        await asyncio.to_thread(write_text)
        added["text_unread"] = len(rows) - len(readings)
    return added


@router.post("/search", openapi_extra=documented(SearchRequest), **answer(SearchResults))
async def search(
    body: Annotated[SearchRequest, json_body(SearchRequest)], state: StateDep
) -> dict[str, Any]:
    """One page: a query (one part or a weighted sum), by vector, words or both (hybrid), or
    the library newest first (browse); ``next`` continues it (:mod:`..querying`)."""
    return await run_search(body, state)


@router.get("/index/info", **answer(IndexInfo))
async def index_info(state: StateDep) -> dict[str, Any]:
    """What the search page's header shows: size, search mode, the index's and server's model."""
    idx = state.require_index()

    served = state.plugin.model_identity

    def read() -> dict[str, Any]:
        stamp = idx.stamp
        stats = idx.stats()
        plan = stats["plan"]
        return {
            "items": stats["items"],
            "mode": stats["mode"],
            "graph_building": stats["graph_building"],
            "store": stats["store"],
            "search_plan": {k: v for k, v in plan.items() if k != "steps"} if plan else None,
            "model_id": stamp.model_id if stamp else None,
            "dim": stamp.dim if stamp else None,
            "server_model_id": served.model_id if served else None,
            "comparable": stamp is None
            or (
                served is not None
                and (stamp.sha256, stamp.dim) == (served.sha256, served.embedding_dim)
            ),
        }

    return await asyncio.to_thread(read)


@router.get("/index/filters", **answer(MetadataKeys))
async def index_filters(state: StateDep) -> dict[str, Any]:
    """The metadata keys the index holds, with item counts and their most common values."""
    idx = state.require_index()

    def read() -> list[dict[str, Any]]:
        return idx.store.metadata_facets() if isinstance(idx.store, Facets) else []

    return {"keys": await asyncio.to_thread(read)}


#: the picture routes' answer in /docs
JPEG: dict[int | str, dict[str, Any]] = {
    200: {"content": {"image/jpeg": {}}, "description": "a JPEG"}
}


@router.get("/items/{key:path}/thumbnail", response_class=Response, responses=JPEG)
async def thumbnail(key: str, state: StateDep) -> Response:
    return await _picture(state, key, 192)


MAX_PREVIEW = 1024


@router.get("/items/{key:path}/preview", response_class=Response, responses=JPEG)
async def preview(key: str, state: StateDep, size: int = 768) -> Response:
    """A larger JPEG of the item for the viewer: at most ``size`` (64-1024) px a side. Items
    added over HTTP have only their stored preview (448 px); the original file is never
    served."""
    if not 64 <= size <= MAX_PREVIEW:
        raise APIError(422, "ValidationError", f"size: between 64 and {MAX_PREVIEW}")
    return await _picture(state, key, size)


async def _picture(state: AppState, key: str, size: int) -> Response:
    idx = state.require_index()
    check_key(key, "id")
    budget = state.plugin.pixel_budget
    max_pixels = state.settings.plugin_config.preprocess.max_image_pixels

    def load() -> bytes | None:
        item = idx.store.get(key)
        stored = idx.store.thumbnail(key) if item else None
        if item is None:
            return None
        if stored is not None:
            return fit_preview(stored, size, budget=budget, max_image_pixels=max_pixels)
        # Only files the index itself recorded are ever read: never a path from the request.
        if not item.path:
            return None
        return make_thumbnail(
            Path(item.path), size=size, budget=budget, max_image_pixels=max_pixels
        )

    try:
        data = await asyncio.to_thread(load)
    except InputError as exc:
        raise APIError(404, "NotFound", f"no preview for {key!r}: {exc}") from exc
    if data is None:
        raise APIError(404, "NotFound", f"no item {key!r}")
    return Response(data, media_type="image/jpeg", headers={"Cache-Control": "max-age=3600"})


@router.get("/items/{key:path}", **answer(Item))
async def item_info(key: str, state: StateDep) -> dict[str, Any]:
    """One indexed item: id, path (as the index recorded it), size, metadata, pictures."""
    idx = state.require_index()
    check_key(key, "id")

    def load() -> Any:
        return idx.store.get(key)

    item = await asyncio.to_thread(load)
    if item is None:
        raise APIError(404, "NotFound", f"no item {key!r}")
    quoted = quote(item.key, safe="")
    return {
        "id": item.key,
        "path": item.path,
        "size": item.size,
        "metadata": item.metadata,
        "thumbnail": f"/items/{quoted}/thumbnail",
        "preview": f"/items/{quoted}/preview",
    }
