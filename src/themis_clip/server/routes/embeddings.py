"""OpenAI's ``/v1/embeddings`` and ``/v1/models``; plain ``/embed/image`` and ``/embed/text``."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response

from themis_clip import jsonio
from themis_clip.files import open_regular
from themis_clip.models import hub
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.server.access import SEARCH
from themis_clip.server.bodies import JSONRoute, documented, json_body, read_form
from themis_clip.server.errors import APIError
from themis_clip.server.payloads import raise_for, vector
from themis_clip.server.schemas import (
    ImageEmbedding,
    ModelCard,
    ModelList,
    OpenAIEmbeddings,
    OpenAIEmbeddingsRequest,
    TextEmbeddings,
    TextRequest,
    TypedInput,
    answer,
)
from themis_clip.server.state import AppState, Part, StateDep

router = APIRouter(route_class=JSONRoute, dependencies=[SEARCH], tags=["embeddings"])

MAX_INPUTS = 2048
_MAX_MANIFEST_BYTES = 1 << 20


def _declared_repo(manifest: Path | None) -> str | None:
    """The ``repo`` a model's manifest declares (its hub repo id), if any."""
    if manifest is None:
        return None
    try:  # read on the event loop at each request: a regular file only, bounded
        with open_regular(manifest) as f:
            data = jsonio.loads(f.read(_MAX_MANIFEST_BYTES))
    except (OSError, ValueError):
        return None
    repo = data.get("repo") if isinstance(data, dict) else None
    return repo if isinstance(repo, str) and repo else None


def served_model_names(plugin: OnnxClipPlugin) -> set[str]:
    """Every ``model`` value a request may name: the served model's id, its name, the repo id
    its manifest declares, and, for a model served by name, its catalogue name and Hub repo
    (the one place that decides which names are this model's)."""
    identity = plugin.model_identity
    assert identity is not None
    names = {identity.model_id, identity.name}
    source = hub.describe(plugin.config.model.path) if plugin.config else None
    if source is not None:
        names |= {v for k in ("catalogue_name", "repo") if isinstance(v := source.get(k), str)}
    spec = plugin.model_spec
    if spec is not None:
        names.add(spec.name)
        repo = _declared_repo(spec.manifest_path)
        if repo:
            names.add(repo)
    return names


def takes_language(plugin: OnnxClipPlugin) -> bool:
    spec = plugin.model_spec
    return spec is not None and spec.text.takes_language


def require_model(model: str | None, plugin: OnnxClipPlugin, aliases: tuple[str, ...] = ()) -> None:
    """404 ``model_not_found`` (OpenAI's error object) for a model this server does not serve,
    by ``model`` or any of ``aliases`` (the served names are read once: a manifest read)."""
    if model is None:
        return
    served = served_model_names(plugin)
    if model in served or not served.isdisjoint(aliases):
        return
    identity = plugin.model_identity
    assert identity is not None
    raise APIError(
        404,
        "ModelNotFound",
        f"the model {model[:200]!r} does not exist on this server; it serves "
        f"{identity.model_id!r} (also accepted: {identity.name!r})",
        fields={"param": "model", "code": "model_not_found"},
    )


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
        # Where it runs and in what arithmetic (bf16 under OpenVINO on AMX CPUs, else f32).
        "backend": stats["backend"],
        "precision": stats["precision"],
        "precision_variant": stats["precision_variant"],
        # Served by name (models/hub): its catalogue name, repo, revision and commit.
        "source": hub.describe(plugin.config.model.path) if plugin.config else None,
    }


@router.get("/v1/models", **answer(ModelList))
async def list_models(state: StateDep) -> dict[str, Any]:
    """The served model, in OpenAI's model-list format (plus dimension and modalities)."""
    return {"object": "list", "data": [_model_card(state)]}


@router.get("/v1/models/{model:path}", **answer(ModelCard))
async def get_model(model: str, state: StateDep) -> dict[str, Any]:
    require_model(model, state.require_ready())
    return _model_card(state)


_DATA_URL = re.compile(r"data:[\w.+-]+/[\w.+-]+[;,]")


def is_image_url(value: str) -> bool:
    """A string input that is a data URL (``data:<type>/<subtype>;...,``) is an image, whatever
    the modality: its decoding refuses a type that is not an image by name (415), where taking
    it for a caption would embed the URL's characters."""
    return _DATA_URL.match(value[:256].lstrip().lower()) is not None


def _token_arrays() -> APIError:
    return APIError(
        422,
        "ValidationError",
        "input: token-id arrays are not accepted: CLIP tokenises text itself, so send the "
        "texts as strings (langchain-openai: OpenAIEmbeddings(check_embedding_ctx_length=False))",
    )


def _chat_part(body: OpenAIEmbeddingsRequest) -> Part:
    """vLLM's ``messages`` form: the conversation's one text or image is its one vector (CLIP
    embeds one input at a time; it cannot fuse a text and an image)."""
    if body.input not in (None, "", []):
        raise APIError(422, "ValidationError", "give either input or messages, not both")
    found: list[tuple[str, Part]] = []
    for m, message in enumerate(body.messages or []):
        if isinstance(message.content, str):
            found.append((f"messages[{m}].content", Part(text=message.content)))
            continue
        for c, part in enumerate(message.content):
            where = f"messages[{m}].content[{c}]"
            if part.type == "text" and part.text is not None:
                found.append((where, Part(text=part.text)))
            elif part.type == "image_url" and part.image_url is not None:
                found.append((where, Part(image=part.image_url.url)))
            else:
                raise APIError(422, "ValidationError", f"{where}: a {part.type} part without it")
    if len(found) != 1:
        where = ", ".join(w for w, _ in found[:3]) or "none"
        raise APIError(
            422,
            "ValidationError",
            f"messages: CLIP embeds one text or one image per request in the chat form; "
            f"found {len(found)} ({where}); send several inputs in 'input' instead",
        )
    return found[0][1]


def _inputs(body: OpenAIEmbeddingsRequest) -> list[str | TypedInput]:
    given = body.input if body.input is not None else []
    raw = [given] if isinstance(given, str) else list(given)
    if not raw:
        raise APIError(422, "ValidationError", "input: at least one item is required")
    if len(raw) > MAX_INPUTS:
        raise APIError(422, "ValidationError", f"input: at most {MAX_INPUTS} items")
    if not all(isinstance(x, str | TypedInput) for x in raw):
        raise _token_arrays()
    return [x for x in raw if isinstance(x, str | TypedInput)]


def _parts(body: OpenAIEmbeddingsRequest) -> list[Part]:
    """The request's inputs: strings (a data:image/ URL is an image, or all are with
    ``modality``), Jina's typed items, or vLLM's chat messages."""
    if body.messages is not None:
        return [_chat_part(body)]
    inputs = _inputs(body)
    strings = [x for x in inputs if isinstance(x, str)]
    is_image = iter(_is_image(strings, body.modality))
    parts = []
    for i, x in enumerate(inputs):
        if isinstance(x, str):
            parts.append(Part(image=x) if next(is_image) else Part(text=x))
        elif (x.text is None) == (x.image is None):
            raise APIError(422, "ValidationError", f"input[{i}]: give one of text or image")
        elif body.modality is not None and body.modality != (
            "text" if x.image is None else "image"
        ):
            kind = "text" if x.image is None else "image"
            raise APIError(
                422,
                "ValidationError",
                f"input[{i}] is {'a' if kind == 'text' else 'an'} {kind} but modality is "
                f"{body.modality!r} (omit modality with typed inputs: each names its kind)",
            )
        else:
            parts.append(Part(text=x.text) if x.image is None else Part(image=x.image))
    return parts


def _is_image(inputs: list[str], modality: str | None) -> list[bool]:
    images = [is_image_url(x) for x in inputs]
    if modality == "text" and any(images):
        i = images.index(True)
        raise APIError(
            422,
            "ValidationError",
            f"input[{i}] is an image data URL but modality is 'text' (omit modality: "
            "data:image/ URLs are embedded as images)",
        )
    if modality == "image":
        for i, x in enumerate(inputs):
            if not images[i] and " " in x.strip():  # base64 has no spaces; words do
                raise APIError(
                    422,
                    "ValidationError",
                    f"input[{i}] is text but modality is 'image' (images are data:image/ "
                    "URLs or base64; omit modality to embed texts and images together)",
                )
        return [True] * len(inputs)
    return images


@router.post(
    "/v1/embeddings",
    openapi_extra=documented(OpenAIEmbeddingsRequest),
    **answer(OpenAIEmbeddings),
)
async def openai_embeddings(
    body: Annotated[OpenAIEmbeddingsRequest, json_body(OpenAIEmbeddingsRequest)],
    state: StateDep,
    response: Response,
) -> dict[str, Any]:
    parts = _parts(body)
    plugin = state.require_ready()
    require_model(body.model, plugin)
    if body.dimensions is not None:
        identity = plugin.model_identity
        dim = identity.embedding_dim if identity else None
        if body.dimensions != dim:
            raise APIError(
                422,
                "ValidationError",
                f"dimensions: this model's embeddings have {dim} dimensions; CLIP embeddings "
                "cannot be shortened (omit 'dimensions' or pass it unchanged)",
            )
    done = await state.embed_parts(parts, language=body.language, truncate=body.truncate)
    cut = [i for i, r in enumerate(done) if r.truncated]
    rows = []
    for i, r in enumerate(done):
        assert r.embedding is not None
        value: Any = (
            base64.b64encode(r.embedding.astype("<f4").tobytes()).decode()
            if body.encoding_format == "base64"
            else vector(r)
        )
        rows.append(
            {"object": "embedding", "index": i, "embedding": value, "truncated": r.truncated}
        )
    response.headers["X-Truncated-Inputs"] = str(len(cut))
    tokens = sum(r.tokens or 0 for r in done)  # token positions the text tower ran
    out: dict[str, Any] = {
        "object": "list",
        "data": rows,
        "model": done[0].model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    has_text = any(p.image is None for p in parts)
    if body.language is not None and has_text and not takes_language(plugin):
        out["language_ignored"] = True
    return out


@router.post("/embed/image", **answer(ImageEmbedding))
async def embed_image(request: Request, state: StateDep) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        upload = (await read_form(request)).get("file", [])
        if len(upload) > 1:
            raise APIError(422, "ValidationError", "file: given more than once")
        if not upload or upload[0].filename is None:
            raise APIError(422, "ValidationError", "multipart body needs a 'file' field")
        data = upload[0].data
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


@router.post("/embed/text", openapi_extra=documented(TextRequest), **answer(TextEmbeddings))
async def embed_text(
    body: Annotated[TextRequest, json_body(TextRequest)], state: StateDep
) -> dict[str, Any]:
    if (body.text is None) == (body.texts is None):
        raise APIError(422, "ValidationError", "give exactly one of 'text' or 'texts'")
    texts = [body.text] if body.text is not None else list(body.texts or [])
    if not texts:
        raise APIError(422, "ValidationError", "texts: at least one text is required")
    results = await state.embed_texts(texts, body.language)
    for i, r in enumerate(results):
        raise_for(r, f"texts[{i}]")
    out: dict[str, Any] = {
        "embeddings": [vector(r) for r in results],
        "truncated": [r.truncated for r in results],
        "model_id": results[0].model_id,
    }
    if body.language is not None and not takes_language(state.plugin):
        out["language_ignored"] = True
    return out
