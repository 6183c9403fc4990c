"""Request and response bodies (pydantic lives only in the server package)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _language() -> Any:
    return Field(
        default=None,
        max_length=16,
        description="Flores-200 code (eng_Latn) for models that take a language prefix",
    )


class OpenAIEmbeddingsRequest(BaseModel):
    """OpenAI's ``/v1/embeddings`` body, plus infinity's ``modality`` for images."""

    model_config = ConfigDict(extra="ignore")
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="texts and images (data:image/...;base64, URLs are images); token-id "
        "arrays are refused (CLIP tokenises text itself)"
    )
    model: str | None = Field(
        default=None, description="the served model's id, name or repo id (else 404)"
    )
    encoding_format: Literal["float", "base64"] = "float"
    modality: Literal["text", "image"] | None = Field(
        default=None,
        description="every input is this (image: data URLs or bare base64); default: "
        "data:image/ URLs are images, the rest text",
    )
    truncate: bool = Field(
        default=True,
        description="cut texts over the context length (each item says so); false: 422",
    )
    user: str | None = None
    dimensions: int | None = Field(
        default=None, ge=1, description="must equal the model's dimension (CLIP cannot shorten)"
    )
    language: str | None = _language()


class TextRequest(_Strict):
    text: str | None = None
    texts: list[str] | None = Field(default=None, max_length=2048)
    language: str | None = _language()


class IndexItem(_Strict):
    id: str = Field(min_length=1, max_length=1024)
    image: str = Field(description="base64 image bytes or a data URL")
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="a JSON object: at most 16 KiB, 8 levels deep, 1,024 keys and values, "
        "keys of 1-256 characters, finite numbers, valid Unicode",
    )


class IndexItemsRequest(_Strict):
    items: list[IndexItem] = Field(min_length=1, max_length=1024)


class QueryPart(_Strict):
    """One part of a query sum: exactly one of text, image, item or vector, with a weight."""

    text: str | None = None
    image: str | None = Field(default=None, description="base64 image bytes or a data URL")
    item: str | None = Field(default=None, min_length=1, max_length=1024)
    vector: list[StrictFloat] | None = Field(default=None, max_length=65536)
    weight: float = Field(
        default=1.0, allow_inf_nan=False, strict=True, description="a number; -1: subtract"
    )


class SearchRequest(_Strict):
    query: list[QueryPart] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="query arithmetic: the normalised weighted sum of the parts' vectors",
    )
    mode: Literal["vector", "hybrid", "lexical", "browse"] = Field(
        default="vector",
        description="hybrid: vector and lexical search (file name, path, string metadata) "
        "fused by reciprocal rank; lexical: words only; browse: no query, newest first",
    )
    cursor: str | None = Field(
        default=None, max_length=4096, description="the previous page's 'next', same query"
    )
    text: str | None = None
    image: str | None = Field(default=None, description="base64 image bytes or a data URL")
    vector: list[StrictFloat] | None = Field(default=None, max_length=65536)
    item: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="more like this: the id of an indexed item, searched by its stored vector",
    )
    k: StrictInt = Field(default=10, ge=1, le=1000)
    filters: dict[str, Any] | None = Field(
        default=None, description="metadata key → value that hits must have (at most 32 keys)"
    )
    where: dict[str, Any] | None = Field(
        default=None,
        description='a filter in the where language: {"taken": {"$gte": "2023-07-01"}}, '
        '{"camera.make": {"$in": ["Canon"]}}, {"gps": {"$near": {"lat", "lon", "km"}}} '
        "(docs/photo-search.md)",
    )
    language: str | None = _language()
    cut: Literal["auto", "none"] | StrictFloat | None = Field(
        default=None,
        description="end the results where relevance ends: auto (the default for a vector "
        "query of texts only: the model's line for unrelated texts on this index, or a gap in "
        "the scores), none, or a cosine score; the answer's 'cut' says where and why",
    )
    sort: Literal["score", "taken", "-taken", "mtime", "name"] = Field(
        default="score",
        description="order of the results: score, capture time (taken oldest first, "
        "-taken newest first; undated last in both), file time (mtime, newest first) or file "
        "name. Any order but score sorts all the matches (after the cut, at most 1000) and "
        "pages through them with 'next'",
    )


class ReloadRequest(_Strict):
    path: str | None = Field(
        default=None, description="model path, relative to (and inside) the server's model root"
    )
    model: str | None = Field(
        default=None,
        max_length=300,
        description="instead of path: a catalogue name or Hub repo id (org/name[@rev]); cached "
        "models only, unless the server runs with --allow-pull",
    )
    variant: str | None = None
    expected_sha256: str | None = None
    enable_mmap_loading: bool | None = None
    allow_embedding_space_change: bool = Field(
        default=False,
        description="swap even though the attached index's vectors become incomparable",
    )


class ClassifyRequest(_Strict):
    image: str | None = Field(default=None, description="base64 image bytes or a data URL")
    item: str | None = Field(default=None, min_length=1, max_length=1024)
    labels: list[str] = Field(min_length=1, max_length=65536, description="see --max-labels")
    template: str = Field(default="a photo of a {}", max_length=1000)


class RankRequest(_Strict):
    """A text ranking images, or an image ranking texts (clip-as-service's ``/rank``)."""

    text: str | None = None
    image: str | None = Field(default=None, description="base64 image bytes or a data URL")
    texts: list[str] | None = Field(default=None, min_length=1, max_length=1024)
    images: list[str] | None = Field(
        default=None, min_length=1, max_length=256, description="base64 images or data URLs"
    )
    language: str | None = _language()
