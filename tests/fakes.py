"""Fakes and data shared by the index tests (test modules never import each other).

- ``FakeEmbedder``: the plugin's batch call with vectors derived from the file bytes, failing
  non-images as the plugin does (and able to "crash" after a number of items);
- ``unit``: a deterministic unit vector per seed; ``write_png``: a small photo-like image;
- ``clustered``: vectors shaped like embeddings (clusters in a low-dimensional subspace).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from tests.helpers import photo_like
from themis_clip import EmbeddingResult
from themis_clip.vocabulary import ModelIdentity

DIM = 16
STAMP = ModelIdentity.from_model_id("fake@abc", sha256="ab" * 32, dim=DIM)


def unit(seed: int | bytes) -> np.ndarray:
    s = int.from_bytes(
        hashlib.sha256(seed if isinstance(seed, bytes) else str(seed).encode()).digest()[:8],
        "little",
    )
    v = np.random.default_rng(s).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


class FakeEmbedder:
    """Vectors derived from file bytes; non-images fail like the plugin does."""

    def __init__(self, crash_after: int | None = None) -> None:
        self.embedded: list[str] = []
        self.crash_after = crash_after

    def generate_embedding_batch(self, images: Sequence[object]) -> list[EmbeddingResult]:
        if self.crash_after is not None and len(self.embedded) >= self.crash_after:
            raise KeyboardInterrupt("simulated crash")
        out = []
        for item in images:
            data = Path(str(item)).read_bytes()
            self.embedded.append(str(item))
            if not data.startswith((b"\x89PNG", b"\xff\xd8")):
                out.append(EmbeddingResult(ok=False, error="not a recognised image format"))
            else:
                out.append(EmbeddingResult.success(unit(data), latency_ms=0.0, model_id="fake"))
        return out


def write_png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(photo_like(20, 16, seed)).save(path)


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered(rng: np.random.Generator, n: int, dim: int = 64) -> np.ndarray:
    """Clusters in an 8-d subspace plus a little noise: shaped like embeddings."""
    centres = rng.standard_normal((200, 8)).astype(np.float32)
    basis = np.linalg.qr(rng.standard_normal((dim, 8)))[0].astype(np.float32)
    labels = rng.integers(0, 200, n)
    inner = centres[labels] + 0.5 * rng.standard_normal((n, 8)).astype(np.float32)
    return unit_rows(inner @ basis.T + 0.02 * rng.standard_normal((n, dim)).astype(np.float32))
