"""OpenAI's ``/v1/embeddings`` and ``/v1/models``; plain ``/embed/image`` and ``/embed/text``."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Request

from themis_clip.server.access import SEARCH
from themis_clip.server.errors import APIError
from themis_clip.server.payloads import decode_image_field, raise_for, vector
from themis_clip.server.schemas import OpenAIEmbeddingsRequest, TextRequest
from themis_clip.server.state import AppState, StateDep

router = APIRouter(dependencies=[SEARCH])

MAX_INPUTS = 2048


def _model_card(state: AppState) -> dict[str, Any]:
    plugin = state.require_ready()
    identity = plugin.model_identity
    assert identity is not None
    stats = plugin.get_statistics()
    return {
        "id": identity.model_id,
        "object": "model",
        "created": int(state.loaded_at),
        "owned_by": "themis-clip",
        "name": identity.name,
        "embedding_dim": identity.embedding_dim,
        "modalities": ["image", "text"] if stats["text_tower"] else ["image"],
        "image_size": stats["image_size"],
    }


@router.get("/v1/models")
async def list_models(state: StateDep) -> dict[str, Any]:
    """The served model, in OpenAI's model-list format (plus dimension and modalities)."""
    return {"object": "list", "data": [_model_card(state)]}


@router.get("/v1/models/{model:path}")
async def get_model(model: str, state: StateDep) -> dict[str, Any]:
    card = _model_card(state)
    if model not in (card["id"], card["name"]):
        raise APIError(404, "ModelNotFound", f"no model {model!r}; this server serves {card['id']}")
    return card


@router.post("/v1/embeddings")
async def openai_embeddings(body: OpenAIEmbeddingsRequest, state: StateDep) -> dict[str, Any]:
    inputs = [body.input] if isinstance(body.input, str) else body.input
    if not inputs:
        raise APIError(422, "ValidationError", "input: at least one item is required")
    if len(inputs) > MAX_INPUTS:
        raise APIError(422, "ValidationError", f"input: at most {MAX_INPUTS} items")
    if body.dimensions is not None:
        identity = state.require_ready().model_identity
        dim = identity.embedding_dim if identity else None
        if body.dimensions != dim:
            raise APIError(
                422,
                "ValidationError",
                f"dimensions: this model's embeddings have {dim} dimensions; CLIP embeddings "
                "cannot be shortened (omit 'dimensions' or pass it unchanged)",
            )
    if body.modality == "image":
        results = await state.embed_images([decode_image_field(x) for x in inputs])
    else:
        results = await state.embed_texts(list(inputs), body.language)
    for i, r in enumerate(results):
        raise_for(r, f"input[{i}]")
    rows = []
    for i, r in enumerate(results):
        assert r.embedding is not None
        value: Any = (
            base64.b64encode(r.embedding.astype("<f4").tobytes()).decode()
            if body.encoding_format == "base64"
            else vector(r)
        )
        rows.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(r.tokens or 0 for r in results)  # token positions the text tower ran
    return {
        "object": "list",
        "data": rows,
        "model": results[0].model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


@router.post("/embed/image")
async def embed_image(request: Request, state: StateDep) -> dict[str, Any]:
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
    result = await state.embed_image(data)
    raise_for(result, "image")
    return {
        "embedding": vector(result),
        "dim": len(vector(result)),
        "model_id": result.model_id,
        "latency_ms": result.latency_ms,
    }


@router.post("/embed/text")
async def embed_text(body: TextRequest, state: StateDep) -> dict[str, Any]:
    if (body.text is None) == (body.texts is None):
        raise APIError(422, "ValidationError", "give exactly one of 'text' or 'texts'")
    texts = [body.text] if body.text is not None else list(body.texts or [])
    if not texts:
        raise APIError(422, "ValidationError", "texts: at least one text is required")
    results = await state.embed_texts(texts, body.language)
    for i, r in enumerate(results):
        raise_for(r, f"texts[{i}]")
    return {
        "embeddings": [vector(r) for r in results],
        "truncated": [r.truncated for r in results],
        "model_id": results[0].model_id,
    }
