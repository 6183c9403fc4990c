"""Where relevance ends: the line random texts reach against an index, and the cut of a ranking.

A cosine has no absolute meaning: what counts as a good text-to-image score differs by model
and by collection (CLIP and SigLIP scores live on different scales). So the line is measured on the
index itself: :data:`RANDOM_TEXTS` texts of random words are scored against (a sample of) the
indexed images, and a hit that scores below the 99th percentile of those pairs is a match no
better than text picked at random would get (1 % of random pairs score above it). The page draws
its "weak matches" divider there. Measured once per model and index version, then cached.

:func:`cut_ranked` ends a text query's ranking where relevance ends (``auto``): below the line
nothing is a match; above it, a gap in the ranked scores wider than :data:`GAP_FACTOR` times the
typical gap between neighbours (at least :data:`MIN_GAP`) ends the matches early, as Weaviate's
autocut cuts at a jump; the answer says which rule cut and where. ``none`` keeps every hit; a
number keeps the hits at or above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from themis_clip.errors import InputError

__all__ = [
    "GAP_FACTOR",
    "MIN_GAP",
    "PERCENTILE",
    "RANDOM_TEXTS",
    "Cut",
    "CutResult",
    "WeakLine",
    "cut_ranked",
    "measure_weak_line",
    "random_texts",
]

#: A gap counts when it is this many times the median gap between neighbouring scores above
#: the line ...
GAP_FACTOR = 4.0
#: ... and at least this wide (cosine).
MIN_GAP = 0.01

PERCENTILE = 99.0
RANDOM_TEXTS = 64
SAMPLE_IMAGES = 2048

_WORDS = (
    "apple",
    "bridge",
    "candle",
    "desert",
    "engine",
    "forest",
    "guitar",
    "harbor",
    "island",
    "jacket",
    "kettle",
    "ladder",
    "market",
    "needle",
    "orchard",
    "pillow",
    "quarry",
    "river",
    "saddle",
    "tunnel",
    "umbrella",
    "valley",
    "window",
    "yacht",
    "zipper",
    "anchor",
    "basket",
    "castle",
    "dragon",
    "elbow",
    "feather",
    "garden",
    "hammer",
    "iceberg",
    "jungle",
    "kitten",
    "lantern",
    "mirror",
    "notebook",
    "ocean",
    "pepper",
    "quilt",
    "rocket",
    "spoon",
    "tiger",
    "violin",
    "wallet",
    "yogurt",
    "bicycle",
    "cactus",
    "dolphin",
    "envelope",
    "fountain",
    "glacier",
    "helmet",
    "igloo",
    "jellyfish",
    "koala",
    "lemon",
    "mountain",
    "nest",
    "octopus",
    "parrot",
    "rainbow",
    "snowman",
    "teapot",
    "volcano",
    "walrus",
)


def random_texts(n: int = RANDOM_TEXTS, seed: int = 26) -> list[str]:
    """``n`` texts of two or three random everyday words (seeded: the same on every run)."""
    rng = np.random.default_rng(seed)
    return [
        " ".join(str(w) for w in rng.choice(_WORDS, size=int(rng.integers(2, 4)), replace=False))
        for _ in range(n)
    ]


@dataclass(frozen=True, kw_only=True)
class WeakLine:
    """``score``: hits below it are weak; ``texts`` × ``images``: the pairs it was measured on."""

    score: float
    texts: int
    images: int

    def describe(self) -> str:
        return (
            f"{100 - PERCENTILE:g}% of {self.texts} random texts x {self.images} indexed "
            f"images score above {self.score:.3f}"
        )


def measure_weak_line(
    text_vectors: np.ndarray, image_vectors: np.ndarray, seed: int = 0
) -> WeakLine | None:
    """The line from unit text vectors ``[t, d]`` and stored image vectors ``[n, d]``
    (a sample of at most :data:`SAMPLE_IMAGES`); None for an empty index."""
    if len(image_vectors) == 0 or len(text_vectors) == 0:
        return None
    if len(image_vectors) > SAMPLE_IMAGES:
        pick = np.random.default_rng(seed).choice(len(image_vectors), SAMPLE_IMAGES, replace=False)
        image_vectors = image_vectors[np.sort(pick)]
    images = image_vectors / np.maximum(np.linalg.norm(image_vectors, axis=1, keepdims=True), 1e-12)
    scores = text_vectors.astype(np.float32) @ images.astype(np.float32).T
    return WeakLine(
        score=float(np.percentile(scores, PERCENTILE)),
        texts=len(text_vectors),
        images=len(images),
    )


@dataclass(frozen=True, kw_only=True)
class Cut:
    """Where a ranking ends: ``auto``, ``none`` or a score (``Cut.parse("0.25")``)."""

    auto: bool = True
    score: float | None = None

    @classmethod
    def parse(cls, value: str | float | None) -> Cut:
        if value is None or value == "auto":
            return cls()
        if value == "none":
            return cls(auto=False)
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise InputError(f"cut {value!r}: give auto, none or a score from -1 to 1") from None
        if not -1.0 <= score <= 1.0:
            raise InputError(f"cut {score}: a score is a cosine from -1 to 1")
        return cls(auto=False, score=score)

    def __str__(self) -> str:
        return "auto" if self.auto else "none" if self.score is None else f"{self.score:g}"


@dataclass(frozen=True, kw_only=True)
class CutResult:
    """How many of the ranked hits are matches, the score they end at and why."""

    kept: int
    at: float | None
    reason: str


def cut_ranked(scores: Sequence[float], cut: Cut, line: WeakLine | None) -> CutResult:
    """The matches among ``scores`` (best first) under ``cut``, the line measured for this
    model on this index (None where none could be measured: ``auto`` then keeps everything)."""
    if cut.score is not None:
        kept = sum(1 for s in scores if s >= cut.score)
        return CutResult(kept=kept, at=cut.score, reason=f"at the score asked for, {cut.score:g}")
    if not cut.auto:
        return CutResult(kept=len(scores), at=None, reason="not cut (cut: none)")
    if line is None:
        return CutResult(
            kept=len(scores), at=None, reason="not cut: no line measured for this index"
        )
    above = [s for s in scores if s >= line.score]
    if not above:
        return CutResult(
            kept=0,
            at=line.score,
            reason=f"nothing scores above {line.score:.3f}, where {line.describe()}: "
            "no photo matches this query",
        )
    gaps = np.diff(np.asarray(above, dtype=np.float64)) * -1.0
    if len(gaps) >= 2:
        widest = int(np.argmax(gaps))
        typical = float(np.median(gaps))
        if gaps[widest] >= max(MIN_GAP, GAP_FACTOR * typical):
            return CutResult(
                kept=widest + 1,
                at=float(above[widest]),
                reason=f"a gap of {gaps[widest]:.3f} after match {widest + 1} "
                f"({GAP_FACTOR:g}x the typical gap), above the line at {line.score:.3f}",
            )
    return CutResult(
        kept=len(above), at=line.score, reason=f"at {line.score:.3f}, where {line.describe()}"
    )
