"""Zero-shot classification: an image against text labels, scored the way the model was trained.

CLIP (and DFN, MetaCLIP, ...) was trained with a softmax over ``logit_scale * cosine``: the
probabilities of a set of labels sum to one. SigLIP was trained with a sigmoid per pair,
``sigmoid(logit_scale * cosine + logit_bias)``: each label has its own probability. Both
constants come from the checkpoint (the manifest's ``scoring``); a model that does not record
them is scored as OpenAI CLIP (``logit_scale`` 100, softmax).

:class:`ZeroShot` is the plugin's zero-shot part: ``classify``, ``classify_embedding`` and
``rank`` over the plugin's own embedding calls, with the label-prompt embedding cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from themis_clip import errors
from themis_clip.errors import InputError, NotReadyError
from themis_clip.interface import EmbeddingResult, ImageData

if TYPE_CHECKING:
    from themis_clip.engine import ClipModel

__all__ = [
    "DEFAULT_LOGIT_SCALE",
    "DEFAULT_TEMPLATE",
    "MAX_LABELS",
    "LabelScore",
    "Ranked",
    "ZeroShot",
    "check_labels",
    "label_prompts",
    "raised",
    "rank_scores",
    "score_labels",
]

#: OpenAI CLIP's learned temperature (``exp(4.6052)``), the default when a model records none
DEFAULT_LOGIT_SCALE = 100.0
DEFAULT_TEMPLATE = "a photo of a {}"
MAX_LABELS = 1024
LABEL_CACHE_SIZE = 8192  # label prompt embeddings kept, across models (oldest dropped first)


@dataclass(frozen=True)
class LabelScore:
    """One label's result: ``probability`` (softmax or sigmoid) and the raw ``logit``."""

    label: str
    probability: float
    logit: float
    cosine: float


def check_labels(labels: Sequence[str], template: str, max_labels: int = MAX_LABELS) -> None:
    """Raises InputError naming the problem with ``labels`` or ``template``."""
    if isinstance(labels, str):
        raise InputError("labels: give a list of labels, not one string")
    if not labels:
        raise InputError("labels: at least one label is required")
    if len(labels) > max_labels:
        raise InputError(f"labels: {len(labels)} given, at most {max_labels}")
    for i, label in enumerate(labels):
        if not isinstance(label, str) or not label.strip():
            raise InputError(f"labels[{i}]: must be a non-empty string")
    if not isinstance(template, str) or template.count("{}") != 1:
        raise InputError(f"template: must contain '{{}}' exactly once, got {template!r}")


def label_prompts(labels: Sequence[str], template: str) -> list[str]:
    return [template.replace("{}", label.strip()) for label in labels]


def score_labels(
    image: npt.NDArray[np.float32],
    label_vectors: npt.NDArray[np.float32],
    labels: Sequence[str],
    *,
    logit_scale: float | None,
    logit_bias: float | None,
) -> list[LabelScore]:
    """Scores of unit ``image`` against unit ``label_vectors`` ``[n, D]``, in label order."""
    cosines = label_vectors.astype(np.float64) @ image.astype(np.float64)
    scale = DEFAULT_LOGIT_SCALE if logit_scale is None else logit_scale
    logits = scale * cosines
    if logit_bias is not None:  # SigLIP: an independent sigmoid per label
        logits = logits + logit_bias
        probs = 1.0 / (1.0 + np.exp(-logits))
    else:
        shifted = np.exp(logits - logits.max())
        probs = shifted / shifted.sum()
    return [
        LabelScore(label=label, probability=float(p), logit=float(z), cosine=float(c))
        for label, p, z, c in zip(labels, probs, logits, cosines, strict=True)
    ]


@dataclass(frozen=True)
class Ranked:
    """One candidate of :func:`rank_scores`: its position in the input, cosine, probability."""

    index: int
    cosine: float
    probability: float


def rank_scores(
    query: npt.NDArray[np.float32],
    candidates: npt.NDArray[np.float32],
    *,
    logit_scale: float | None,
    logit_bias: float | None,
) -> list[Ranked]:
    """Candidates ``[n, D]`` by similarity to ``query``, best first, with the model's
    probabilities (softmax over the candidates for CLIP, a sigmoid per candidate for SigLIP)."""
    names = [str(i) for i in range(len(candidates))]
    scores = score_labels(query, candidates, names, logit_scale=logit_scale, logit_bias=logit_bias)
    ranked = [
        Ranked(index=i, cosine=s.cosine, probability=s.probability) for i, s in enumerate(scores)
    ]
    return sorted(ranked, key=lambda r: -r.cosine)


def raised(result: EmbeddingResult) -> Exception:
    """The library exception an ``ok=False`` result stands for (its class, by name)."""
    cls = getattr(errors, result.error_type or "", None)
    if isinstance(cls, type) and issubclass(cls, errors.ThemisClipError):
        return cls(result.error or "failed")
    return errors.InferenceError(result.error or "failed")


class Embedder(Protocol):
    """The plugin's embedding calls that zero-shot is built on."""

    def generate_embedding(self, image_data: ImageData) -> EmbeddingResult: ...

    def generate_embedding_batch(self, images: Sequence[ImageData]) -> list[EmbeddingResult]: ...

    def generate_text_embedding(
        self, text: str, language: str | None = None
    ) -> EmbeddingResult: ...

    def generate_text_embedding_batch(
        self, texts: Sequence[str], language: str | None = None
    ) -> list[EmbeddingResult]: ...


class ZeroShot:
    """Zero-shot classification and ranking over an :class:`Embedder`.

    Args:
        embedder: the plugin whose embedding calls are used.
        current: the plugin's active model (None when not initialised); its identity keys the
            label cache and its spec gives the scoring constants.
    """

    def __init__(self, embedder: Embedder, current: Callable[[], ClipModel | None]) -> None:
        self._embedder = embedder
        self._current = current
        self._cache: OrderedDict[tuple[str, str], npt.NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()

    def classify(
        self, image_data: ImageData, labels: Sequence[str], *, template: str, max_labels: int
    ) -> list[LabelScore]:
        check_labels(labels, template, max_labels)
        result = self._embedder.generate_embedding(image_data)
        if not result.ok or result.embedding is None:
            raise raised(result)
        return self.classify_embedding(
            result.embedding, labels, template=template, max_labels=max_labels
        )

    def classify_embedding(
        self,
        embedding: npt.NDArray[np.float32],
        labels: Sequence[str],
        *,
        template: str,
        max_labels: int,
    ) -> list[LabelScore]:
        check_labels(labels, template, max_labels)
        model = self._model()
        vectors = self._label_vectors(model, label_prompts(labels, template))
        vector = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if vector.shape != (vectors.shape[1],):
            raise InputError(
                f"embedding has {vector.size} dimensions, this model's {vectors.shape[1]}"
            )
        return score_labels(
            vector,
            vectors,
            labels,
            logit_scale=model.spec.logit_scale,
            logit_bias=model.spec.logit_bias,
        )

    def rank(
        self,
        query: ImageData | str,
        candidates: Sequence[ImageData] | Sequence[str],
        *,
        language: str | None,
        max_candidates: int,
    ) -> list[Ranked]:
        items = list(candidates)
        if not items:
            raise InputError("candidates: at least one is required")
        if len(items) > max_candidates:
            raise InputError(f"candidates: {len(items)} given, at most {max_candidates}")
        embedder = self._embedder
        if isinstance(query, str):
            q = embedder.generate_text_embedding(query, language)
            found = embedder.generate_embedding_batch(items)
        else:
            texts = [c for c in items if isinstance(c, str)]
            if len(texts) != len(items):
                bad = next(i for i, c in enumerate(items) if not isinstance(c, str))
                raise InputError(
                    f"candidates[{bad}]: an image query ranks texts; give str candidates"
                )
            q = embedder.generate_embedding(query)
            found = embedder.generate_text_embedding_batch(texts, language)
        vectors: list[npt.NDArray[np.float32]] = []
        for r in (q, *found):
            if not r.ok or r.embedding is None:
                raise raised(r)
            vectors.append(r.embedding)
        model = self._model()
        if {r.model_id for r in (q, *found)} != {model.identity.model_id}:
            raise NotReadyError("the model was swapped while ranking; retry")
        return rank_scores(
            vectors[0],
            np.stack(vectors[1:]),
            logit_scale=model.spec.logit_scale,
            logit_bias=model.spec.logit_bias,
        )

    def _model(self) -> ClipModel:
        model = self._current()
        if model is None:
            raise NotReadyError("the onnx_clip plugin is not initialised (call initialize())")
        return model

    def _label_vectors(self, model: ClipModel, prompts: list[str]) -> npt.NDArray[np.float32]:
        prefix = model.identity.model_id
        with self._lock:
            known = {p: self._cache.get((prefix, p)) for p in prompts}
        missing = [p for p, v in known.items() if v is None]
        if missing:
            results = self._embedder.generate_text_embedding_batch(missing)
            fresh: dict[str, npt.NDArray[np.float32]] = {}
            for prompt, result in zip(missing, results, strict=True):
                if not result.ok or result.embedding is None:
                    raise raised(result)
                if result.model_id != prefix:
                    raise NotReadyError("the model was swapped while classifying; retry")
                fresh[prompt] = known[prompt] = result.embedding
            with self._lock:
                for prompt, vector in fresh.items():
                    self._cache[(prefix, prompt)] = vector
                while len(self._cache) > LABEL_CACHE_SIZE:
                    self._cache.popitem(last=False)
        return np.stack([known[p] for p in prompts]).astype(np.float32)  # type: ignore[misc]
