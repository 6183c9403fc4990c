"""The index: add items, search by text, image or vector, item thumbnails."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
from fastapi import APIRouter
from fastapi.responses import Response

from themis_clip.errors import InputError
from themis_clip.index.metadata import validate_metadata
from themis_clip.index.stores import ItemRow
from themis_clip.index.where import parse_where
from themis_clip.preprocess.image import make_thumbnail
from themis_clip.server.errors import APIError
from themis_clip.server.payloads import decode_image_field, raise_for
from themis_clip.server.schemas import IndexItemsRequest, SearchRequest
from themis_clip.server.state import AppState, StateDep

router = APIRouter()


@router.post("/index/items")
async def index_items(body: IndexItemsRequest, state: StateDep) -> dict[str, Any]:
    idx = state.require_index()
    seen: dict[str, int] = {}
    for i, item in enumerate(body.items):
        if item.id in seen:
            raise APIError(
                422,
                "ValidationError",
                f"items[{i}].id: {item.id!r} repeats items[{seen[item.id]}].id; ids in one "
                "request must be unique",
            )
        seen[item.id] = i
        validate_metadata(item.metadata, where=f"items[{i}].metadata")
    data = [decode_image_field(item.image) for item in body.items]
    results = await state.embed_images(data)
    for item, r in zip(body.items, results, strict=True):
        raise_for(r, f"item {item.id!r}")
    budget = state.plugin.pixel_budget
    max_pixels = state.settings.plugin_config.preprocess.max_image_pixels
    thumbs = await asyncio.to_thread(  # decoded within the same pixel budget as embeddings
        lambda: [make_thumbnail(d, budget=budget, max_image_pixels=max_pixels) for d in data]
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

    await asyncio.to_thread(write)
    return {"added": len(rows), "ids": [r.key for r in rows], "model_id": current.model_id}


@router.post("/search")
async def search(body: SearchRequest, state: StateDep) -> dict[str, Any]:
    idx = state.require_index()
    where = parse_where(body.where) if body.where is not None else None  # 422 before any work
    given = [x is not None for x in (body.text, body.image, body.vector, body.item)]
    if sum(given) != 1:
        raise APIError(
            422, "ValidationError", "give exactly one of 'text', 'image', 'vector' or 'item'"
        )
    if body.item is not None:  # stored vectors against stored vectors: one space, always
        item_key = body.item

        def like() -> tuple[list[Any], str, str]:
            stamp = idx.stamp
            try:
                hits = idx.search_like(item_key, body.k, body.filters, where=where)
            except KeyError:
                raise APIError(404, "NotFound", f"no item {item_key!r}") from None
            return hits, idx.mode, stamp.model_id if stamp else state.stamp().model_id

        hits, mode, space = await asyncio.to_thread(like)
        return _results(hits, mode, space)
    if body.vector is not None:
        query = np.asarray(body.vector, dtype=np.float32)
        current = state.stamp()
        dim = idx.stamp.dim if idx.stamp is not None else current.embedding_dim
        if query.shape != (dim,):
            raise APIError(
                422,
                "ValidationError",
                f"vector: {query.size} components; this index's vectors have {dim}",
            )
        norm = float(np.linalg.norm(query))
        if not np.isfinite(norm) or norm == 0:
            raise APIError(422, "ValidationError", "vector must be finite and non-zero")
        query /= norm
    else:
        for _ in range(3):  # the query and the index check must see the same model
            result = await (
                state.embed_text(body.text, body.language)
                if body.text is not None
                else state.embed_image(decode_image_field(body.image or ""))
            )
            raise_for(result, "query")
            current = state.stamp()
            if result.model_id == current.model_id:
                break
        assert result.embedding is not None
        query = result.embedding

    def run() -> tuple[list[Any], str]:
        if idx.stamp is not None:
            idx.bind_model(current)  # 409 when the index was built by another model
        return idx.search(query, body.k, body.filters, where=where), idx.mode

    hits, mode = await asyncio.to_thread(run)
    return _results(hits, mode, current.model_id)


def _results(hits: list[Any], mode: str, model_id: str) -> dict[str, Any]:
    return {
        "results": [
            {
                "id": h.key,
                "score": h.score,
                "path": h.path,
                "metadata": h.metadata,
                "thumbnail": f"/items/{quote(h.key, safe='')}/thumbnail",
                "preview": f"/items/{quote(h.key, safe='')}/preview",
            }
            for h in hits
        ],
        "model_id": model_id,
        "mode": mode,
    }


@router.get("/index/info")
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


@router.get("/index/filters")
async def index_filters(state: StateDep) -> dict[str, Any]:
    """The metadata keys the index holds, with item counts and their most common values."""
    idx = state.require_index()

    def read() -> list[dict[str, Any]]:
        return idx.store.metadata_facets()

    return {"keys": await asyncio.to_thread(read)}


@router.get("/items/{key:path}/thumbnail")
async def thumbnail(key: str, state: StateDep) -> Response:
    return await _picture(state, key, 192)


MAX_PREVIEW = 1024


@router.get("/items/{key:path}/preview")
async def preview(key: str, state: StateDep, size: int = 768) -> Response:
    """A larger JPEG of the item for the viewer: at most ``size`` (64-1024) px a side. Items
    added over HTTP have only their stored thumbnail; the original file is never served."""
    if not 64 <= size <= MAX_PREVIEW:
        raise APIError(422, "ValidationError", f"size: between 64 and {MAX_PREVIEW}")
    return await _picture(state, key, size)


async def _picture(state: AppState, key: str, size: int) -> Response:
    idx = state.require_index()
    budget = state.plugin.pixel_budget
    max_pixels = state.settings.plugin_config.preprocess.max_image_pixels

    def load() -> bytes | None:
        item = idx.store.get(key)
        stored = idx.store.thumbnail(key) if item else None
        if item is None:
            return None
        if stored is not None:
            return stored
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


@router.get("/items/{key:path}")
async def item_info(key: str, state: StateDep) -> dict[str, Any]:
    """One indexed item: id, path (as the index recorded it), size, metadata, pictures."""
    idx = state.require_index()

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
