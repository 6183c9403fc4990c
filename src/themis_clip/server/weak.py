"""Where "weak" begins: the score random texts reach against an index, measured per model.

A cosine has no absolute meaning: what counts as a good text-to-image score differs by model
and by collection (CLIP and SigLIP scores live on different scales). So the line is measured on the
index itself: :data:`RANDOM_TEXTS` texts of random words are scored against (a sample of) the
indexed images, and a hit that scores below the 99th percentile of those pairs is a match no
better than text picked at random would get (1 % of random pairs score above it). The page draws
its "weak matches" divider there. Measured once per model and index version, then cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PERCENTILE", "RANDOM_TEXTS", "WeakLine", "measure_weak_line", "random_texts"]

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
