"""The photo routes: ``GET /duplicates?threshold=`` (groups of near-duplicate items,
:mod:`...index.duplicates`) and ``GET /index/photo-facets`` (the date range and camera makes
the page's filters offer)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query

from themis_clip.index.duplicates import DEFAULT_THRESHOLD, find_duplicates
from themis_clip.server.access import SEARCH
from themis_clip.server.state import StateDep

router = APIRouter(dependencies=[SEARCH])  # what search keys may read


@router.get("/duplicates")
async def duplicates(
    state: StateDep,
    threshold: float = Query(default=DEFAULT_THRESHOLD, ge=-1.0, le=1.0),
) -> dict[str, Any]:
    """Groups of near-duplicates, most similar first; each item with its thumbnail URL."""
    idx = state.require_index()
    groups = await asyncio.to_thread(find_duplicates, idx, threshold=threshold)
    out = []
    for group in groups:
        items = [
            {**item, "thumbnail": f"/items/{quote(str(item['key']), safe='')}/thumbnail"}
            for item in group.items
        ]
        out.append({"items": items, "score": group.score})
    return {"threshold": threshold, "groups": out}


@router.get("/index/photo-facets")
async def photo_facets(state: StateDep) -> dict[str, Any]:
    """``{"taken": {"first", "last"} | null, "makes": [{"make", "count"}]}``."""
    idx = state.require_index()
    return await asyncio.to_thread(idx.store.photo_facets)
