"""Other services' embedding APIs, each translated onto the one embedding path.

A door parses its peer's request into :class:`~themis_clip.server.state.Part` items, embeds
them with :meth:`AppState.embed_parts` (the batchers, limits and errors of ``/v1/embeddings``,
so the same input gives the same vector through every door) and answers in its peer's shape:

* immich's machine-learning service: ``GET /ping`` and ``POST /predict`` (multipart:
  ``entries`` JSON, an ``image`` file or a ``text`` field), the ``clip`` task only; the vector
  is a JSON string, as immich's server stores it. Its routes admit keyless requests from the
  networks given to ``--immich-from`` (immich's server sends no credentials).
* Ollama's ``POST /api/embed``, text-embeddings-inference's ``POST /embed`` and Cohere's
  ``POST /v2/embed`` (``texts``, ``images``, typed ``inputs``; ``embedding_types``).

Jina's typed inputs and vLLM's chat ``messages`` are forms of ``/v1/embeddings`` itself
(routes/embeddings.py). Errors keep this server's one JSON shape and status table.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from themis_clip.interface import EmbeddingResult
from themis_clip.preprocess.image import image_dimensions
from themis_clip.server.access import BY_NETWORK, PUBLIC, SEARCH
from themis_clip.server.bodies import (
    JSONRoute,
    documented,
    json_body,
    json_text,
    parse_json,
    read_form,
)
from themis_clip.server.errors import APIError
from themis_clip.server.routes.embeddings import (
    MAX_INPUTS,
    is_image_url,
    require_model,
    takes_language,
)
from themis_clip.server.schemas import ContentPart, answer
from themis_clip.server.state import AppState, Part, StateDep

log = logging.getLogger(__name__)

#: the doors' group in /docs
TAG = "other services"


class ImmichPrediction(BaseModel):
    """immich's answer for the ``clip`` task."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    clip: str = Field(description="the vector as a JSON string, as immich's server stores it")
    image_height: int | None = Field(default=None, alias="imageHeight")
    image_width: int | None = Field(default=None, alias="imageWidth")


class OllamaEmbeddings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class CohereEmbeddings(BaseModel):
    """Cohere's v2 answer: the vectors by embedding type."""

    model_config = ConfigDict(extra="forbid")
    id: str
    embeddings: dict[str, list[Any]]
    texts: list[str]
    meta: dict[str, Any]
    response_type: Literal["embeddings_by_type"]


# immich's health check
public = APIRouter(route_class=JSONRoute, dependencies=[PUBLIC], tags=[TAG])
immich = APIRouter(route_class=JSONRoute, dependencies=[SEARCH, BY_NETWORK], tags=[TAG])
router = APIRouter(route_class=JSONRoute, dependencies=[SEARCH], tags=[TAG])


def _embedding(r: EmbeddingResult) -> npt.NDArray[np.float32]:
    assert r.embedding is not None
    return r.embedding


def _count(values: list[Any], what: str) -> None:
    if len(values) > MAX_INPUTS:
        raise APIError(422, "ValidationError", f"{what}: at most {MAX_INPUTS} items")


def _same_dimension(given: int | None, state: AppState, what: str) -> None:
    identity = state.require_ready().model_identity
    dim = identity.embedding_dim if identity else None
    if given is not None and given != dim:
        raise APIError(
            422,
            "ValidationError",
            f"{what}: this model's embeddings have {dim} dimensions; CLIP embeddings cannot "
            f"be shortened (omit '{what}' or pass it unchanged)",
        )


def _string_parts(inputs: list[str]) -> list[Part]:
    """Strings as ``/v1/embeddings`` reads them: a ``data:image/`` URL is an image."""
    return [Part(image=x) if is_image_url(x) else Part(text=x) for x in inputs]


# immich ------------------------------------------------------------------------------------

#: immich's interface languages (Weblate codes) → the Flores-200 codes NLLB-SigLIP models
#: take, as immich's machine-learning service maps them.
WEBLATE_TO_FLORES200 = {
    "af": "afr_Latn", "ar": "arb_Arab", "az": "azj_Latn", "be": "bel_Cyrl", "bg": "bul_Cyrl",
    "ca": "cat_Latn", "cs": "ces_Latn", "da": "dan_Latn", "de": "deu_Latn", "el": "ell_Grek",
    "en": "eng_Latn", "es": "spa_Latn", "et": "est_Latn", "fa": "pes_Arab", "fi": "fin_Latn",
    "fr": "fra_Latn", "he": "heb_Hebr", "hi": "hin_Deva", "hr": "hrv_Latn", "hu": "hun_Latn",
    "hy": "hye_Armn", "id": "ind_Latn", "it": "ita_Latn", "ja": "jpn_Hira", "kmr": "kmr_Latn",
    "ko": "kor_Hang", "lb": "ltz_Latn", "lt": "lit_Latn", "lv": "lav_Latn", "mfa": "zsm_Latn",
    "mk": "mkd_Cyrl", "mn": "khk_Cyrl", "mr": "mar_Deva", "ms": "zsm_Latn", "nb-NO": "nob_Latn",
    "nn": "nno_Latn", "nl": "nld_Latn", "pl": "pol_Latn", "pt-BR": "por_Latn", "pt": "por_Latn",
    "ro": "ron_Latn", "ru": "rus_Cyrl", "sk": "slk_Latn", "sl": "slv_Latn", "sr-Cyrl": "srp_Cyrl",
    "sv": "swe_Latn", "ta": "tam_Taml", "te": "tel_Telu", "th": "tha_Thai", "tr": "tur_Latn",
    "uk": "ukr_Cyrl", "ur": "urd_Arab", "vi": "vie_Latn", "zh-CN": "zho_Hans",
    "zh-Hans": "zho_Hans", "zh-TW": "zho_Hant",
}  # fmt: skip


def flores_code(language: str) -> str:
    """immich's rule: the code, else its part before ``-``, else English."""
    code = WEBLATE_TO_FLORES200.get(language) or WEBLATE_TO_FLORES200.get(language.split("-")[0])
    if code is None:
        log.warning("immich language %r has no Flores-200 code; using eng_Latn", language[:40])
    return code or "eng_Latn"


def _invalid(message: str) -> APIError:
    return APIError(422, "ValidationError", f"entries: {message}")


def clip_entry(entries: str) -> tuple[str, str, dict[str, Any]]:
    """``(model name, "visual" or "textual", options)`` of immich's ``entries`` field.

    Raises:
        APIError: 422 for a malformed field; 501 ``UnsupportedTask`` for a task other than
            ``clip`` (facial recognition, OCR), which immich logs with the status.
    """
    try:
        request = parse_json(entries.encode("utf-8", "surrogatepass"))
    except APIError as exc:
        raise _invalid(exc.message) from None
    if not isinstance(request, dict) or not request:
        raise _invalid('a JSON object such as {"clip": {"visual": {"modelName": "..."}}}')
    other = sorted(t for t in request if t != "clip")
    if other:
        raise APIError(
            501,
            "UnsupportedTask",
            f"this server runs immich's 'clip' task only, not {other[0][:40]!r}: point immich's "
            "facial recognition and OCR at immich's own machine-learning service",
        )
    types = request["clip"]
    if not isinstance(types, dict) or len(types) != 1:
        raise _invalid("'clip' needs exactly one of 'visual' or 'textual'")
    ((kind, entry),) = types.items()
    if kind not in ("visual", "textual"):
        raise _invalid(f"clip type {str(kind)[:40]!r} is neither 'visual' nor 'textual'")
    name = entry.get("modelName") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not name:
        raise _invalid(f"clip.{kind}.modelName must be a model name")
    options = entry.get("options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise _invalid(f"clip.{kind}.options must be an object")
    return name, kind, options


@public.get("/ping", response_class=PlainTextResponse)
async def ping() -> PlainTextResponse:
    """immich's availability check."""
    return PlainTextResponse("pong")


@immich.post("/predict", **answer(ImmichPrediction))
async def predict(request: Request, state: StateDep) -> dict[str, Any]:
    """immich's ``/predict`` for the ``clip`` task: ``{"clip": "[...]"}`` (the vector as JSON
    text), with ``imageHeight`` and ``imageWidth`` for an image."""
    form = await read_form(request)
    for field in ("entries", "image", "text"):
        if len(form.get(field, ())) > 1:  # which one was meant is a guess: none is taken
            raise APIError(422, "ValidationError", f"{field}: given more than once")
    entries, image, text = (form.get(f, [None])[0] for f in ("entries", "image", "text"))
    if entries is None or entries.filename is not None:
        raise APIError(422, "ValidationError", "entries: a form field with the JSON request")
    name, kind, options = clip_entry(entries.text())
    if image is not None and text is not None:
        raise APIError(
            422, "ValidationError", f"clip.{kind}: give an 'image' file or a 'text' field, not both"
        )
    plugin = state.require_ready()
    _require_immich_model(name, state)
    if kind == "visual":
        if image is None or image.filename is None:
            raise APIError(422, "ValidationError", "clip.visual needs an 'image' file")
        data = image.data
        (result,) = await state.embed_parts([Part(image=data)], where="image")
        size = image_dimensions(data) or (0, 0)
        return {
            "clip": json_text(_embedding(result)),
            "imageHeight": size[1],
            "imageWidth": size[0],
        }
    if text is None or text.filename is not None:
        raise APIError(422, "ValidationError", "clip.textual needs a 'text' field")
    language = options.get("language")
    flores = (
        flores_code(language)
        if isinstance(language, str) and language and takes_language(plugin)
        else None
    )
    (result,) = await state.embed_parts([Part(text=text.text())], language=flores, where="text")
    return {"clip": json_text(_embedding(result))}


def _require_immich_model(name: str, state: AppState) -> None:
    """immich names its models ``ViT-B-32__openai`` (or ``immich-app/ViT-B-32__openai``): a
    vector of another model would be silently incomparable with those immich stored."""
    bare = name.removeprefix("immich-app/")
    require_model(name, state.require_ready(), (bare, f"immich-app/{bare}"))


# Ollama ------------------------------------------------------------------------------------


class OllamaEmbedRequest(BaseModel):
    """Ollama's ``/api/embed`` body (``options`` and ``keep_alive`` are accepted, unused)."""

    model_config = ConfigDict(extra="ignore")
    model: str = ""
    input: str | list[str] = Field(
        default="", description="texts; a data:image/...;base64, URL is an image"
    )
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


@router.post("/api/embed", openapi_extra=documented(OllamaEmbedRequest), **answer(OllamaEmbeddings))
async def ollama_embed(
    body: Annotated[OllamaEmbedRequest, json_body(OllamaEmbedRequest)], state: StateDep
) -> dict[str, Any]:
    """Ollama's embed: ``{"model", "embeddings", "total_duration", "load_duration",
    "prompt_eval_count"}``; an empty input answers no embeddings, as Ollama does."""
    started = time.perf_counter_ns()
    require_model(body.model or None, state.require_ready())
    _same_dimension(body.dimensions, state, "dimensions")
    inputs = [] if body.input == "" else [body.input] if isinstance(body.input, str) else body.input
    _count(inputs, "input")
    done = (
        await state.embed_parts(
            _string_parts(inputs),
            truncate=body.truncate,
            truncate_hint='send "truncate": true to embed its first tokens',
        )
        if inputs
        else []
    )
    return {
        "model": done[0].model_id if done else state.model_id(),
        "embeddings": [_embedding(r).tolist() for r in done],
        "total_duration": time.perf_counter_ns() - started,
        "load_duration": 0,
        "prompt_eval_count": sum(r.tokens or 0 for r in done),
    }


# text-embeddings-inference ----------------------------------------------------------------


class TEIEmbedRequest(BaseModel):
    """text-embeddings-inference's ``/embed`` body."""

    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str] = Field(description="texts; a data:image/...;base64, URL is an image")
    normalize: bool = True
    truncate: bool = False
    truncation_direction: str = "right"
    prompt_name: str | None = None
    dimensions: int | None = None


@router.post("/embed", openapi_extra=documented(TEIEmbedRequest))
async def tei_embed(
    body: Annotated[TEIEmbedRequest, json_body(TEIEmbedRequest)], state: StateDep
) -> list[list[float]]:
    """TEI's embed: one vector per input, as a JSON array of arrays."""
    if not body.normalize:
        raise APIError(
            422,
            "ValidationError",
            "normalize: false is not available: CLIP embeddings are served as unit vectors",
        )
    if body.truncation_direction.lower() != "right":
        raise APIError(
            422,
            "ValidationError",
            "truncation_direction: only 'right' (CLIP keeps a text's first tokens)",
        )
    if body.prompt_name is not None:
        raise APIError(422, "ValidationError", "prompt_name: this model has no prompts")
    _same_dimension(body.dimensions, state, "dimensions")
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not inputs:
        raise APIError(422, "ValidationError", "inputs: at least one item is required")
    _count(inputs, "inputs")
    done = await state.embed_parts(
        _string_parts(inputs),
        truncate=body.truncate,
        where="inputs",
        truncate_hint='send "truncate": true to embed its first tokens',
    )
    return [_embedding(r).tolist() for r in done]


# Cohere ------------------------------------------------------------------------------------

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


def _float_only() -> list[EmbeddingType]:
    return ["float"]


class CohereInput(BaseModel):
    """One of Cohere's typed ``inputs``: its content, one text or one image here."""

    model_config = ConfigDict(extra="ignore")
    content: list[ContentPart] = Field(min_length=1)


class CohereEmbedRequest(BaseModel):
    """Cohere's v2 ``/v2/embed`` body (``input_type`` and ``max_tokens`` are accepted; CLIP
    embeds queries and documents alike)."""

    model_config = ConfigDict(extra="ignore")
    model: str
    input_type: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = Field(default=None, description="data:image/...;base64, URLs")
    inputs: list[CohereInput] | None = None
    embedding_types: list[EmbeddingType] = Field(default_factory=_float_only, min_length=1)
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: int | None = None
    max_tokens: int | None = None


def _cohere_parts(body: CohereEmbedRequest) -> list[Part]:
    given = [
        (k, v) for k, v in (("texts", body.texts), ("images", body.images), ("inputs", body.inputs))
    ]
    present = [k for k, v in given if v is not None]
    if len(present) != 1:
        raise APIError(422, "ValidationError", "give exactly one of texts, images or inputs")
    if body.texts is not None:
        _count(body.texts, "texts")
        return [Part(text=t) for t in body.texts]
    if body.images is not None:
        _count(body.images, "images")
        return [Part(image=x) for x in body.images]
    inputs = body.inputs or []
    _count(inputs, "inputs")
    parts = []
    for i, item in enumerate(inputs):
        if len(item.content) != 1:
            raise APIError(
                422,
                "ValidationError",
                f"inputs[{i}].content: one text or one image per input (CLIP cannot fuse a "
                "text and an image into one vector)",
            )
        (c,) = item.content
        if c.type == "text" and c.text is not None:
            parts.append(Part(text=c.text))
        elif c.type == "image_url" and c.image_url is not None:
            parts.append(Part(image=c.image_url.url))
        else:
            raise APIError(422, "ValidationError", f"inputs[{i}].content[0]: empty {c.type}")
    return parts


def quantized(embeddings: npt.NDArray[np.float32], kind: str) -> list[Any]:
    """Cohere's embedding types of unit vectors ``(n, d)`` float32.

    ``int8``: each vector scaled so its largest component is 127 (compare by cosine);
    ``uint8``: that plus 128; ``binary`` / ``ubinary``: the signs packed 8 to a byte
    (``binary`` is the byte minus 128, as sentence-transformers packs it); ``base64``: the
    little-endian float32 bytes.
    """
    if kind == "float":
        return embeddings.tolist()  # type: ignore[no-any-return]
    if kind == "base64":
        return [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in embeddings]
    if kind in ("int8", "uint8"):
        peak = np.maximum(np.abs(embeddings).max(axis=1, keepdims=True), 1e-12)
        q = np.rint(embeddings / peak * 127).astype(np.int16)
        return (q + 128 if kind == "uint8" else q).tolist()  # type: ignore[no-any-return]
    packed = np.packbits(embeddings > 0, axis=1).astype(np.int16)
    return (packed - 128 if kind == "binary" else packed).tolist()  # type: ignore[no-any-return]


@router.post("/v2/embed", openapi_extra=documented(CohereEmbedRequest), **answer(CohereEmbeddings))
async def cohere_embed(
    body: Annotated[CohereEmbedRequest, json_body(CohereEmbedRequest)], state: StateDep
) -> dict[str, Any]:
    """Cohere's v2 embed: ``{"id", "embeddings": {type: [...]}, "texts", "meta",
    "response_type": "embeddings_by_type"}``."""
    require_model(body.model, state.require_ready())
    _same_dimension(body.output_dimension, state, "output_dimension")
    if body.truncate == "START":
        raise APIError(
            422,
            "ValidationError",
            "truncate: START is not available (CLIP keeps a text's first tokens: END or NONE)",
        )
    parts = _cohere_parts(body)
    if not parts:
        raise APIError(422, "ValidationError", "at least one item is required")
    done = await state.embed_parts(
        parts,
        truncate=body.truncate == "END",
        where=next(k for k in ("texts", "images", "inputs") if getattr(body, k) is not None),
        truncate_hint='send "truncate": "END" to embed its first tokens',
    )
    matrix = np.stack([_embedding(r) for r in done])
    tokens = sum(r.tokens or 0 for r in done)
    images = sum(p.image is not None for p in parts)
    return {
        "id": str(uuid.uuid4()),
        "embeddings": {
            kind: quantized(matrix, kind) for kind in dict.fromkeys(body.embedding_types)
        },
        "texts": [p.text for p in parts if p.text is not None],
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"input_tokens": tokens, "images": images},
        },
        "response_type": "embeddings_by_type",
    }
