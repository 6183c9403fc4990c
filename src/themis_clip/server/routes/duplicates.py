"""The photo routes: ``GET /duplicates?threshold=`` (groups of near-duplicate items,
:mod:`...index.duplicates`) and ``GET /index/photo-facets`` (the date range and camera makes
the page's filters offer)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query

from themis_clip.index.duplicates import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW_S,
    DuplicateGroup,
    find_duplicates,
)
from themis_clip.index.stores import Facets
from themis_clip.preprocess.image import same_pixels
from themis_clip.server.access import SEARCH
from themis_clip.server.bodies import JSONRoute
from themis_clip.server.schemas import DuplicateGroups, PhotoFacets, answer
from themis_clip.server.state import INDEX_HELD, StateDep

# what search keys may read
router = APIRouter(route_class=JSONRoute, dependencies=[SEARCH, INDEX_HELD], tags=["index"])


@router.get("/duplicates", **answer(DuplicateGroups))
async def duplicates(
    state: StateDep,
    threshold: float = Query(default=DEFAULT_THRESHOLD, ge=-1.0, le=1.0),
    window_s: float = Query(default=DEFAULT_WINDOW_S, ge=0.0, le=86400.0),
) -> dict[str, Any]:
    """Groups of near-duplicates, most similar first, each with its tier (``identical``,
    ``same-pixels``, ``resized``, ``similar``) and a suggested ``keeper`` with the reason;
    each item with its thumbnail URL.

    One pass runs at a time and its answer is kept until the index changes (a pass over a
    large library takes seconds of every core; asking again, or many clients asking, must
    not multiply that). A pass keeps running when its client leaves, so the next asker gets
    its result."""
    idx = state.require_index()
    async with state.duplicates_lock:
        key = (idx.store.write_version, threshold, window_s)
        groups: list[DuplicateGroup] | None = state.duplicate_groups.get(key)
        if groups is None:
            work = asyncio.to_thread(
                find_duplicates,
                idx,
                threshold=threshold,
                window_s=window_s,
                same_pixels=same_pixels,
            )
            groups = await asyncio.shield(asyncio.ensure_future(work))
            state.duplicate_groups.clear()  # only the latest version's answers are kept
            state.duplicate_groups[key] = groups
    out = []
    for group in groups:
        items = [
            {**item, "thumbnail": f"/items/{quote(str(item['key']), safe='')}/thumbnail"}
            for item in group.items
        ]
        out.append({**group.to_dict(), "items": items})
    return {"threshold": threshold, "window_s": window_s, "groups": out}


@router.get("/index/photo-facets", **answer(PhotoFacets))
async def photo_facets(state: StateDep) -> dict[str, Any]:
    """``{"taken": {"first", "last"} | null, "makes": [{"make", "count"}]}``."""
    store = state.require_index().store
    if not isinstance(store, Facets):
        return {"taken": None, "makes": []}
    return await asyncio.to_thread(store.photo_facets)
