"""``/search``'s query: its parts embedded through the server's batchers (items and vectors
from the request and the index), combined and run as one page; the arithmetic, modes and
paging are :mod:`themis_clip.index.query`'s, the cut, order and weak-match line
:mod:`themis_clip.collection`'s, as for the library and the CLI."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from themis_clip.collection import choose_cut, cut_matches, weak_line
from themis_clip.index.paging import Cursor, decode_cursor, encode_cursor, fingerprint
from themis_clip.index.query import QueryMode, combine, search_page
from themis_clip.index.relevance import WeakLine, random_texts
from themis_clip.index.search import Hit, VectorIndex
from themis_clip.index.where import with_filters
from themis_clip.server.errors import APIError
from themis_clip.server.payloads import check_filters, check_key, decode_image_fields, raise_for
from themis_clip.server.schemas import QueryPart, SearchRequest
from themis_clip.server.state import AppState
from themis_clip.vocabulary import ModelIdentity

__all__ = ["run_search"]


def _parts(body: SearchRequest) -> list[QueryPart]:
    single = [x is not None for x in (body.text, body.image, body.vector, body.item)]
    if body.query is not None:
        if any(single):
            raise APIError(
                422,
                "ValidationError",
                "give either 'query' or one of 'text', 'image', 'vector' or 'item', not both",
            )
        for i, part in enumerate(body.query):
            given = [x is not None for x in (part.text, part.image, part.vector, part.item)]
            if sum(given) != 1:
                raise APIError(
                    422,
                    "ValidationError",
                    f"query[{i}]: give exactly one of 'text', 'image', 'vector' or 'item'",
                )
        return list(body.query)
    filtered = body.filters is not None or body.where is not None or body.sort != "score"
    if sum(single) > 1 or (not any(single) and body.mode != "browse" and not filtered):
        raise APIError(
            422, "ValidationError", "give exactly one of 'text', 'image', 'vector' or 'item'"
        )
    if not any(single):
        return []
    return [QueryPart(text=body.text, image=body.image, vector=body.vector, item=body.item)]


def _identity(part: QueryPart) -> dict[str, Any]:
    if part.text is not None:
        what: dict[str, Any] = {"text": part.text}
    elif part.item is not None:
        what = {"item": part.item}
    else:
        data = part.image if part.image is not None else repr(part.vector)
        what = {("image" if part.image is not None else "vector"): _digest(data)}
    return {**what, "weight": part.weight}


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


async def _embedded(
    parts: list[QueryPart], state: AppState, language: str | None
) -> tuple[dict[int, npt.NDArray[np.float32]], ModelIdentity]:
    """The text and image parts' embeddings by part number, all by the current model."""
    texts = [(i, p.text) for i, p in enumerate(parts) if p.text is not None]
    images = [(i, p.image) for i, p in enumerate(parts) if p.image is not None]
    data = await decode_image_fields([image or "" for _, image in images]) if images else []
    for _ in range(3):  # the query and the index check must see the same model
        results = [
            *(await state.embed_texts([t or "" for _, t in texts], language) if texts else []),
            *(await state.embed_images(data) if data else []),
        ]
        for r in results:
            raise_for(r, "query")
        current = state.stamp()
        if all(r.model_id == current.model_id for r in results):
            break
    out = {}
    for (i, _), r in zip([*texts, *images], results, strict=True):
        assert r.embedding is not None
        out[i] = r.embedding
    return out, current


async def run_search(body: SearchRequest, state: AppState) -> dict[str, Any]:
    """One page of ``body``'s query over the server's index, as ``/search`` answers it."""
    idx = state.require_index()
    mode = QueryMode(body.mode)
    if (
        mode == QueryMode.VECTOR
        and body.query is None
        and not any(x is not None for x in (body.text, body.image, body.vector, body.item))
    ):
        mode = QueryMode.BROWSE  # a filter or an order and no query: the matching items
    check_filters(body.filters)
    where = with_filters(body.filters, body.where)  # a bad filter is a 422, before any work
    parts = _parts(body)
    for i, part in enumerate(parts):
        if part.item is not None:
            check_key(part.item, "item" if body.item is not None else f"query[{i}].item")
    if mode == QueryMode.BROWSE and parts:
        raise APIError(
            422, "ValidationError", "mode 'browse' takes no query (it lists newest first)"
        )
    # The words matched are the first positive text part's (as the CLI's TEXT): the other
    # parts shape the vector; joining them would require every part's words at once.
    words = next((p.text for p in parts if p.text is not None and p.weight > 0), "")
    modelled = any(p.text is not None or p.image is not None for p in parts)
    needs_vector = mode in (QueryMode.VECTOR, QueryMode.HYBRID)
    embedded: dict[int, npt.NDArray[np.float32]] = {}
    current: ModelIdentity | None = None
    if needs_vector and modelled:
        embedded, current = await _embedded(parts, state, body.language)

    # A query sorted by anything but its score is sorted over all its matches (at most
    # SORTED_MAX, after the cut), and paged here: sorting each page alone broke the order.
    sorted_query = body.sort != "score" and mode != QueryMode.BROWSE
    identity = {
        "parts": [_identity(p) for p in parts],
        "language": body.language,
    }

    def run() -> tuple[list[Hit], str | None, str, str]:
        stamp = idx.stamp
        if current is not None and stamp is not None:
            idx.bind_model(current)  # 409 when the index was built by another model
        space = current.model_id if current else stamp.model_id if stamp else state.stamp().model_id
        # an empty index has no dimension yet: a vector part then has the served model's
        vector = _combined(parts, embedded, idx, current or state.stamp()) if needs_vector else None
        page = search_page(
            idx,
            mode=mode,
            k=SORTED_MAX if sorted_query else body.k,
            identity={**identity, "space": space},
            vector=vector,
            text=words or None,
            cursor=None if sorted_query else body.cursor,
            # "more like this": the items the query is made of are no answer
            exclude=frozenset(p.item for p in parts if p.item is not None and p.weight > 0),
            where=where,
            order="newest" if body.sort == "score" else body.sort,
        )
        return page.hits, page.next, idx.mode, space

    hits, token, kind, space = await asyncio.to_thread(run)
    texts_only = current is not None and bool(parts) and all(p.text is not None for p in parts)
    line = await _weak_line(state, current) if texts_only and current is not None else None
    cut = choose_cut(
        body.cut,
        texts_only=texts_only and mode == QueryMode.VECTOR,
        line=line,
        later_page=body.cursor is not None and not sorted_query,
    )
    matches = cut_matches(hits, cut, line, sort="score" if mode == QueryMode.BROWSE else body.sort)
    kept = matches.hits
    if matches.weaker:
        token = None  # the matches end on this page
    if sorted_query:  # all the matches in their order: this page of them
        query_id = fingerprint(
            {**identity, "space": space, "sort": body.sort, "cut": body.cut, "mode": str(mode)}
            | {"where": str(where) if where is not None else None}
        )
        kept, token = _sorted_page(kept, body.k, body.cursor, query_id)
    assert matches.cut is not None
    out = {**results(kept, kind, space), "next": token}
    out["cut"] = {"at": matches.cut.at, "reason": matches.cut.reason, "weaker": matches.weaker}
    if line is not None:  # text → image: where a match stops meaning one
        out["weak_below"] = line.score
        out["weak_basis"] = line.describe()
    return out


#: the most matches a query sorted by date, file time or name is sorted over
SORTED_MAX = 1000


def _sorted_page(
    ordered: list[Hit], k: int, cursor: str | None, query_id: str
) -> tuple[list[Hit], str | None]:
    """Page ``k`` of ``ordered`` after ``cursor`` (its offset; just after its last key when
    the set has changed) and the cursor of the next page, if there is one."""
    start = 0
    if cursor is not None:
        after = decode_cursor(cursor, query=query_id)
        keys = [h.key for h in ordered]
        start = keys.index(after.key) + 1 if after.key in keys else min(after.offset, len(keys))
    page = ordered[start : start + k]
    more = start + len(page) < len(ordered) and bool(page)
    token = Cursor(query=query_id, offset=start + len(page), key=page[-1].key) if more else None
    return page, encode_cursor(token) if token is not None else None


async def _weak_line(state: AppState, current: ModelIdentity) -> WeakLine | None:
    """:func:`~themis_clip.collection.weak_line` of this model on this index, its random
    texts embedded through the server's batcher; cached per model and index version."""
    idx = state.require_index()

    def version() -> int:
        return idx.store.write_version

    key = (current.model_id, await asyncio.to_thread(version))
    if key in state.weak_lines:
        line: WeakLine | None = state.weak_lines[key]
        return line
    texts = await state.embed_texts(random_texts())
    if not all(r.ok and r.model_id == current.model_id for r in texts):
        return None
    text_vectors = np.stack([r.embedding for r in texts if r.embedding is not None])
    line = await asyncio.to_thread(weak_line, idx, text_vectors, current.dim)
    state.weak_lines.clear()  # one line is kept: this model's, on this version of the index
    state.weak_lines[key] = line
    return line


def _combined(
    parts: list[QueryPart],
    embedded: dict[int, npt.NDArray[np.float32]],
    idx: VectorIndex,
    current: ModelIdentity | None,
) -> npt.NDArray[np.float32]:
    stamp = idx.stamp
    dim = stamp.dim if stamp is not None else current.embedding_dim if current else None
    vectors: list[tuple[npt.NDArray[np.float32], float]] = []
    for i, part in enumerate(parts):
        where = "vector" if len(parts) == 1 and part.vector is not None else f"query[{i}]"
        if i in embedded:
            vector = embedded[i]
        elif part.item is not None:
            stored = idx.store.vector(part.item)
            if stored is None:
                raise APIError(404, "NotFound", f"no item {part.item!r}")
            vector = stored
        else:
            with np.errstate(over="ignore"):  # too large for float32: infinite, refused below
                vector = np.asarray(part.vector, dtype=np.float32)
            if dim is not None and vector.shape != (dim,):
                raise APIError(
                    422,
                    "ValidationError",
                    f"{where}: {vector.size} components; this index's vectors have {dim}",
                )
            if not np.isfinite(vector).all():
                raise APIError(
                    422,
                    "ValidationError",
                    f"{where}: components must be finite 32-bit floats (at most 3.4e38 in size)",
                )
            if not vector.any():
                raise APIError(
                    422,
                    "ValidationError",
                    f"{where}: all components are zero as 32-bit floats "
                    "(values under 1.2e-38 in size round to zero)",
                )
        vectors.append((vector, part.weight))
    return combine(vectors)


def results(hits: list[Hit], mode: str, model_id: str) -> dict[str, Any]:
    return {
        "results": [
            {
                "id": h.key,
                "score": h.score,
                "path": h.path,
                "metadata": h.metadata,
                "thumbnail": f"/items/{quote(h.key, safe='')}/thumbnail",
                "preview": f"/items/{quote(h.key, safe='')}/preview",
                "text_matches": list(h.text_matches),
            }
            for h in hits
        ],
        "model_id": model_id,
        "mode": mode,
    }
