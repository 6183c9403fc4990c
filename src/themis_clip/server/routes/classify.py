"""Zero-shot: ``POST /v1/classify`` (an image or indexed item against labels), ``POST /rank``."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter

from themis_clip.server.access import SEARCH
from themis_clip.server.bodies import JSONRoute, documented, json_body
from themis_clip.server.errors import APIError
from themis_clip.server.payloads import check_key, check_text, decode_image_fields, raise_for
from themis_clip.server.schemas import Classification, ClassifyRequest, Ranking, RankRequest, answer
from themis_clip.server.state import INDEX_HELD, StateDep
from themis_clip.zeroshot import check_labels

router = APIRouter(route_class=JSONRoute, dependencies=[SEARCH, INDEX_HELD], tags=["zero-shot"])

#: labels embedded per step of a large /v1/classify (see ``classify``)
LABEL_PIECE = 64


@router.post("/v1/classify", openapi_extra=documented(ClassifyRequest), **answer(Classification))
async def classify(
    body: Annotated[ClassifyRequest, json_body(ClassifyRequest)], state: StateDep
) -> dict[str, Any]:
    """Per-label probabilities for one image (``image``) or an indexed item (``item``).

    Softmax over the labels for CLIP models, an independent sigmoid per label for models that
    record a ``logit_bias`` (SigLIP); labels are returned most probable first.
    """
    plugin = state.require_ready()
    if (body.image is None) == (body.item is None):
        raise APIError(422, "ValidationError", "give exactly one of 'image' or 'item'")
    for where, text in [
        ("template", body.template),
        *((f"labels[{i}]", label) for i, label in enumerate(body.labels)),
    ]:
        check_text(text, where)
    if body.item is not None:
        check_key(body.item, "item")
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
        result = await state.embed_image((await decode_image_fields([body.image or ""]))[0])
        raise_for(result, "image")
        vector = result.embedding
    max_labels = state.settings.max_labels
    await asyncio.to_thread(check_labels, body.labels, body.template, max_labels)
    # The labels' embeddings are computed (and cached by the plugin) a piece at a time, so that
    # a request whose client has gone stops within one piece instead of embedding them all.
    if len(body.labels) > LABEL_PIECE:
        for start in range(0, len(body.labels), LABEL_PIECE):
            await asyncio.to_thread(
                plugin.classify_embedding,
                vector,
                body.labels[start : start + LABEL_PIECE],
                template=body.template,
                max_labels=max_labels,
            )
    scores = await asyncio.to_thread(
        plugin.classify_embedding,
        vector,
        body.labels,
        template=body.template,
        max_labels=max_labels,
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


@router.post("/rank", openapi_extra=documented(RankRequest), **answer(Ranking))
async def rank(
    body: Annotated[RankRequest, json_body(RankRequest)], state: StateDep
) -> dict[str, Any]:
    """``text`` with ``images``, or ``image`` with ``texts``: candidates best first, with their
    cosine and the model's probability (softmax over the candidates, or SigLIP's sigmoid)."""
    plugin = state.require_ready()
    if (body.text is None) == (body.image is None) or (body.texts is None) == (body.images is None):
        raise APIError(422, "ValidationError", "give 'text' with 'images', or 'image' with 'texts'")
    if (body.text is None) != (body.images is None):
        raise APIError(422, "ValidationError", "a text ranks 'images'; an image ranks 'texts'")
    if body.text is not None:
        query: Any = body.text
        candidates: list[Any] = await decode_image_fields(list(body.images or []))
    else:
        query = (await decode_image_fields([body.image or ""]))[0]
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
