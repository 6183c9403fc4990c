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


class TypedInput(_Strict):
    """Jina's typed input: ``{"text": ...}`` or ``{"image": data URL or base64}``."""

    text: str | None = None
    image: str | None = None


class ImageURL(BaseModel):
    url: str


class ContentPart(BaseModel):
    """A chat message's part (OpenAI's chat form, as vLLM's embeddings take it)."""

    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None


class ChatMessage(BaseModel):
    role: str = "user"
    content: str | list[ContentPart]


class OpenAIEmbeddingsRequest(BaseModel):
    """OpenAI's ``/v1/embeddings`` body, plus infinity's ``modality`` for images, Jina's typed
    inputs and vLLM's chat ``messages``."""

    model_config = ConfigDict(extra="ignore")
    input: str | list[str | TypedInput] | list[int] | list[list[int]] | None = Field(
        default=None,
        description="texts and images (data:image/...;base64, URLs are images; Jina's "
        '{"text": ...} and {"image": ...} items too); token-id arrays are refused (CLIP '
        "tokenises text itself)",
    )
    messages: list[ChatMessage] | None = Field(
        default=None,
        max_length=64,
        description="vLLM's chat form instead of input: one text or one image_url part in "
        "all, embedded as one vector",
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


class MigrateRequest(_Strict):
    """Move the server's index to another model in the background (``/admin/migrate``)."""

    path: str | None = Field(
        default=None, description="model path, relative to (and inside) the server's model root"
    )
    model: str | None = Field(
        default=None, max_length=300, description="instead of path: a cached catalogue name"
    )
    variant: str | None = None
    cores: float | None = Field(
        default=None,
        gt=0,
        le=1024,
        description="the share of the cores the migration uses: 0.5 is one thread working "
        "half the time, 3 is three threads (default: a quarter of the cores, at least 0.5)",
    )
    cut_over: Literal["auto", "command"] = Field(
        default="auto",
        description="switch as soon as the shadow is complete, or on POST /admin/migrate/cut-over",
    )
    drop_missing: bool = Field(
        default=False, description="cut over even when some items cannot be re-embedded"
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


# -- answers: what the JSON routes return, shown in /docs (the routes build plain dicts; a test
# -- checks real answers against these models, extra keys refused) ---------------------------


class Health(_Strict):
    status: Literal["ok"]


class Readiness(_Strict):
    """503 until the model is loaded and warmed up."""

    ready: bool
    model_id: str | None


class ModelCard(_Strict):
    """The served model, in OpenAI's ``model`` object plus what a CLIP client needs."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    name: str
    embedding_dim: int
    modalities: list[Literal["image", "text"]]
    image_size: int | None
    backend: str = Field(description="what the session runs on: cpu, cuda, openvino, ...")
    precision: str | None = Field(
        description="the arithmetic the provider runs the graph's float operations in "
        "(f32, bf16, f16)"
    )
    precision_variant: str | None = Field(
        description="the exported weights: fp32, fp16, int8 (int8's matrix products run in "
        "int8 whatever the precision)"
    )
    source: dict[str, Any] | None = Field(description="catalogue name, repo and commit")


class ModelList(_Strict):
    object: Literal["list"]
    data: list[ModelCard]


class OpenAIEmbedding(_Strict):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian f32")
    truncated: bool


class OpenAIUsage(_Strict):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddings(_Strict):
    """OpenAI's embeddings list; header ``X-Truncated-Inputs`` counts the truncated texts."""

    object: Literal["list"]
    data: list[OpenAIEmbedding]
    model: str | None
    usage: OpenAIUsage
    language_ignored: bool | None = Field(default=None, description="the model takes none")


class ImageEmbedding(_Strict):
    embedding: list[float]
    dim: int
    model_id: str | None
    latency_ms: float


class TextEmbeddings(_Strict):
    embeddings: list[list[float]]
    truncated: list[bool]
    model_id: str | None
    language_ignored: bool | None = Field(default=None, description="the model takes none")


class LabelProbability(_Strict):
    label: str
    probability: float
    logit: float
    cosine: float


class Classification(_Strict):
    """The labels in the order given."""

    labels: list[LabelProbability]
    model_id: str | None
    scoring: Literal["softmax", "sigmoid"]


class RankedCandidate(_Strict):
    index: int = Field(description="the candidate's position in the request")
    cosine: float
    probability: float


class Ranking(_Strict):
    """The candidates, best first."""

    ranking: list[RankedCandidate]
    model_id: str | None


class ItemsAdded(_Strict):
    added: int
    ids: list[str]
    model_id: str
    text_unread: int | None = Field(
        default=None,
        description="with OCR on: items stored without their text, the request's deadline "
        "having come first or the client gone (post them again in smaller batches)",
    )


class TextMatch(_Strict):
    """A line of text read in the picture (OCR) that the query's words matched."""

    text: str = Field(description="the line as read")
    box: list[list[float]] = Field(
        description="its 4 corners [x, y] in the picture's upright pixels, clockwise from the "
        "text's top-left"
    )
    confidence: float = Field(description="the recogniser's confidence, 0-1")
    frame: list[int] = Field(
        description="[width, height]: the picture's upright size in pixels, the box's frame "
        "(scale the box by the shown size over this)"
    )


class Item(_Strict):
    """An indexed item; ``thumbnail`` and ``preview`` are its pictures' URLs."""

    id: str
    score: float | None = Field(default=None, description="in search results: the ranking score")
    path: str | None
    size: int | None = Field(default=None, description="the file's bytes (items only)")
    metadata: dict[str, Any] | None
    thumbnail: str
    preview: str
    text_matches: list[TextMatch] = Field(
        default_factory=list,
        description="lexical and hybrid results: the lines of text read in the picture that "
        "the query's words matched (by substring, or tolerantly), and where",
    )


class CutSummary(_Strict):
    at: float | None = Field(description="the score the matches end at")
    reason: str
    weaker: int = Field(description="hits below the cut, left out")


class SearchResults(_Strict):
    """One page; ``next`` continues it (null: the last page)."""

    results: list[Item]
    model_id: str
    mode: str = Field(description="how the index searched: exact or a graph")
    next: str | None
    cut: CutSummary
    weak_below: float | None = Field(default=None, description="text queries: the weak line")
    weak_basis: str | None = Field(default=None, description="how the weak line was measured")


class IndexInfo(_Strict):
    items: int
    mode: str
    graph_building: bool
    store: str
    search_plan: dict[str, Any] | None
    model_id: str | None = Field(description="the model that built the index")
    dim: int | None
    server_model_id: str | None
    comparable: bool = Field(description="the served model can search this index")


class MetadataKeys(_Strict):
    keys: list[dict[str, Any]] = Field(description="each key with its item count and values")


class PhotoFacets(_Strict):
    taken: dict[str, Any] | None = Field(description="first and last capture time")
    makes: list[dict[str, Any]] = Field(description="camera makes with their counts")


class DuplicateGroups(_Strict):
    """Groups most similar first, each with its tier, items and suggested keeper."""

    threshold: float
    window_s: float
    groups: list[dict[str, Any]]


class Reloaded(_Strict):
    """200 when the new model serves; 202 (``pulling``) while a named model downloads."""

    reloaded: bool
    model_id: str | None = None
    generation: int | None = None
    space_changed: bool | None = None
    pulling: str | None = None
    status: str | None = None


class MigrationStatus(_Strict):
    """A migration's progress; ``state`` is ``idle`` when none ran since the server started."""

    state: str
    model_id: str | None = None
    done: int | None = None
    total: int | None = None
    embedded: int | None = None
    items_per_s: float | None = None
    eta_s: float | None = None
    from_previews: int | None = None
    missing: list[dict[str, str]] | None = None
    error: str | None = None
    cut_over: str | None = None
    lost_by_rollback: int | None = Field(
        default=None,
        description="after a rollback: items written or deleted after the cut-over, which the "
        "restored index does not have",
    )


class Statistics(BaseModel):
    """The plugin's statistics (the seed's names: calls, latency, backend, model) and the
    server's; the key set follows the runtime and the model."""

    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    """``type`` names the problem's kind (``ValidationError``, ``NotFound``, ``BadJSON``, ...);
    the OpenAI routes add ``param`` and ``code`` as OpenAI does."""

    model_config = ConfigDict(extra="allow")
    type: str
    message: str


class ErrorAnswer(_Strict):
    """Every error the service answers (429 and 503 come with ``Retry-After``)."""

    error: ErrorDetail


#: the app's error answers in /docs (instead of FastAPI's own validation body, never sent)
ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorAnswer, "description": "the request cannot be answered as sent"},
    "5XX": {"model": ErrorAnswer, "description": "the service cannot answer now"},
}


def answer(model: type[BaseModel]) -> dict[str, Any]:
    """A route decorator's arguments: ``model`` as its 200 body in ``/docs``, not validated at
    run time (the answers are built as dicts; large vectors are not copied through pydantic)."""
    return {"responses": {200: {"model": model}}, "response_model": None}
