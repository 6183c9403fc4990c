"""Zero-shot: ``POST /v1/classify`` (an image or indexed item against labels), ``POST /rank``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from themis_clip.server.access import SEARCH
from themis_clip.server.errors import APIError
from themis_clip.server.payloads import decode_image_field, raise_for
from themis_clip.server.schemas import ClassifyRequest, RankRequest
from themis_clip.server.state import StateDep

router = APIRouter(dependencies=[SEARCH])


@router.post("/v1/classify")
async def classify(body: ClassifyRequest, state: StateDep) -> dict[str, Any]:
    """Per-label probabilities for one image (``image``) or an indexed item (``item``).

    Softmax over the labels for CLIP models, an independent sigmoid per label for models that
    record a ``logit_bias`` (SigLIP); labels are returned most probable first.
    """
    plugin = state.require_ready()
    if (body.image is None) == (body.item is None):
        raise APIError(422, "ValidationError", "give exactly one of 'image' or 'item'")
    current = state.stamp()
    if body.item is not None:
        idx = state.require_index()
        key = body.item

        def stored() -> Any:
            with state.index_lock:
                stamp = idx.stamp
                if stamp is not None:
                    idx.bind_model(current)  # 409 when the index was built by another model
                return idx.store.vector(key)

        vector = await asyncio.to_thread(stored)
        if vector is None:
            raise APIError(404, "NotFound", f"no item {key!r}")
    else:
        result = await state.embed_image(decode_image_field(body.image or ""))
        raise_for(result, "image")
        vector = result.embedding
    scores = await asyncio.to_thread(
        plugin.classify_embedding,
        vector,
        body.labels,
        template=body.template,
        max_labels=state.settings.max_labels,
    )
    ranked = sorted(scores, key=lambda s: -s.probability)
    identity = plugin.model_identity
    return {
        "labels": [
            {"label": s.label, "probability": s.probability, "logit": s.logit, "cosine": s.cosine}
            for s in ranked
        ],
        "model_id": identity.model_id if identity else current.model_id,
        "scoring": "sigmoid" if plugin.scoring["logit_bias"] is not None else "softmax",
    }


@router.post("/rank")
async def rank(body: RankRequest, state: StateDep) -> dict[str, Any]:
    """``text`` with ``images``, or ``image`` with ``texts``: candidates best first, with their
    cosine and the model's probability (softmax over the candidates, or SigLIP's sigmoid)."""
    plugin = state.require_ready()
    if (body.text is None) == (body.image is None) or (body.texts is None) == (body.images is None):
        raise APIError(422, "ValidationError", "give 'text' with 'images', or 'image' with 'texts'")
    if (body.text is None) != (body.images is None):
        raise APIError(422, "ValidationError", "a text ranks 'images'; an image ranks 'texts'")
    if body.text is not None:
        query: Any = body.text
        candidates: list[Any] = [decode_image_field(x) for x in body.images or []]
    else:
        query = decode_image_field(body.image or "")
        candidates = list(body.texts or [])
    ranked = await asyncio.to_thread(
        plugin.rank,
        query,
        candidates,
        language=body.language,
        max_candidates=state.settings.max_labels,
    )
    identity = plugin.model_identity
    return {
        "ranking": [
            {"index": r.index, "cosine": r.cosine, "probability": r.probability} for r in ranked
        ],
        "model_id": identity.model_id if identity else None,
    }
