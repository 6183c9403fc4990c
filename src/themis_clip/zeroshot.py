"""Zero-shot classification: an image against text labels, scored the way the model was trained.

CLIP (and DFN, MetaCLIP, ...) was trained with a softmax over ``logit_scale * cosine``: the
probabilities of a set of labels sum to one. SigLIP was trained with a sigmoid per pair,
``sigmoid(logit_scale * cosine + logit_bias)``: each label has its own probability. Both
constants come from the checkpoint (the manifest's ``scoring``); a model that does not record
them is scored as OpenAI CLIP (``logit_scale`` 100, softmax).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from themis_clip.errors import InputError

__all__ = [
    "DEFAULT_LOGIT_SCALE",
    "DEFAULT_TEMPLATE",
    "MAX_LABELS",
    "LabelScore",
    "Ranked",
    "check_labels",
    "label_prompts",
    "rank_scores",
    "score_labels",
]

#: OpenAI CLIP's learned temperature (``exp(4.6052)``), the default when a model records none
DEFAULT_LOGIT_SCALE = 100.0
DEFAULT_TEMPLATE = "a photo of a {}"
MAX_LABELS = 1024


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
