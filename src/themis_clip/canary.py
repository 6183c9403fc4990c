"""The canary: a provider serves only if it embeds like ONNX Runtime's CPU provider in fp32.

At every load (so after every hot swap too), a tower opened on anything but the CPU provider in
fp32 (a GPU, OpenVINO, a reduced precision) embeds golden inputs (the warm-up input and images
drawn by :mod:`themis_clip.demo.scenes` for the image tower; the probe row and captions for the
text tower) each alone and all in one batch; a reference session of the same graph on the CPU
provider in fp32 embeds each alone (or its vectors are read from the reference cache, where
``session.optimized_model_cache_dir`` keeps them). The smallest cosine must reach the floor
(``canary_min_cosine``), else the provider is refused with the figure. This catches a provider
that returns one vector for every input, lets batch-mates leak into each other, or loses too
much precision; why: such a provider corrupts an index silently, and nothing else would notice.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip import jsonio
from themis_clip.demo.scenes import Scene, render_scene
from themis_clip.engine import TextualTower, VisualTower, l2_normalize
from themis_clip.preprocess.image import ImagePreprocessor

log = logging.getLogger(__name__)

__all__ = [
    "CanaryResult",
    "Reference",
    "Verdict",
    "cached_reference",
    "golden_pixels",
    "golden_rows",
    "min_cosine",
    "probe",
    "verdict",
]

#: the golden images: distinct shapes, colours and places, drawn the same on every machine
GOLDEN_SCENES = (
    Scene(shape="circle", colour="red", seed=1),
    Scene(shape="square", colour="blue", size="small", position="left", seed=2),
    Scene(shape="triangle", colour="green", position="right", seed=3),
    Scene(shape="star", colour="yellow", size="small", seed=4),
)
GOLDEN_CAPTIONS = ("a photo of a dog", "a red circle", "ein Haus am See", "🙂 1234 ...")


@dataclass(frozen=True, kw_only=True)
class CanaryResult:
    """One tower's canary: its smallest cosine to the CPU fp32 reference and the floor."""

    tower: str
    min_cosine: float
    floor: float

    @property
    def passed(self) -> bool:
        return self.min_cosine >= self.floor


def golden_pixels(preprocessor: ImagePreprocessor) -> npt.NDArray[np.float32]:
    """The image tower's golden inputs ``[5, 3, S, S]``: the warm-up zeros, then the scenes."""
    size = preprocessor.spec.image_size
    images = [preprocessor(render_scene(s, size=max(size, 64))) for s in GOLDEN_SCENES]
    return np.stack([np.zeros((3, size, size), np.float32), *images]).astype(np.float32)


def golden_rows(tower: TextualTower) -> list[list[int]]:
    """The text tower's golden token rows: the probe row, then the captions."""
    batch = tower.tokenizer.encode_batch(list(GOLDEN_CAPTIONS))
    return [tower.tokenizer.probe_row(), *(list(r) for r in batch.rows if r)]


#: the reference: the vectors of the golden inputs, each embedded alone on CPU fp32
Reference = Callable[[Sequence[Any]], npt.NDArray[np.float32]]


def min_cosine(
    run: Callable[[Any], npt.NDArray[np.float32]],
    reference: Reference,
    inputs: Sequence[Any] | npt.NDArray[Any],
    join: Callable[[Sequence[Any]], Any],
) -> float:
    """The smallest cosine between ``run``'s embeddings of ``inputs`` (each alone, and all in
    one batch made by ``join``) and ``reference``'s of each alone; -1 for a vector that is not
    finite or is zero."""
    items = [inputs[i : i + 1] for i in range(len(inputs))]
    ref, ref_ok = l2_normalize(reference(items))
    worst = 1.0
    for out in (np.concatenate([run(x) for x in items]), run(join(items))):
        got, ok = l2_normalize(out)
        cos = np.where(ok & ref_ok, np.sum(got * ref, axis=1, dtype=np.float64), -1.0)
        worst = min(worst, float(cos.min()))
    return worst


def probe(
    tower: VisualTower | TextualTower,
    reference: Reference,
    floor: float,
    preprocessor: ImagePreprocessor,
) -> CanaryResult:
    """Run the canary on ``tower`` against ``reference`` (the same graph on CPU fp32)."""
    if isinstance(tower, VisualTower):
        pixels = golden_pixels(preprocessor)
        cos = min_cosine(tower.run, reference, pixels, np.concatenate)
        return CanaryResult(tower="visual", min_cosine=cos, floor=floor)
    rows = golden_rows(tower)
    cos = min_cosine(tower.run, reference, rows, lambda items: [r for x in items for r in x])
    return CanaryResult(tower="textual", min_cosine=cos, floor=floor)


def cached_reference(
    folder: Path, key: str, compute: Reference, *, refresh: bool = False
) -> Reference:
    """``compute``, its vectors kept in ``folder`` under ``key`` plus the inputs' bytes, so a
    later load with the same model file and inputs skips the reference session (about 1 s for
    ViT-B/32). An unreadable entry, or any with ``refresh``, is computed again and replaced; an
    unwritable folder only logs."""

    def reference(items: Sequence[Any]) -> npt.NDArray[np.float32]:
        h = hashlib.sha256(key.encode())
        for item in items:
            a = np.ascontiguousarray(item)
            h.update(f"{a.dtype}{a.shape}".encode() + a.tobytes())
        path = folder / f"canary-{h.hexdigest()[:32]}.npy"
        try:
            cached: npt.NDArray[np.float32] = np.load(path, allow_pickle=False)
            if (
                not refresh
                and cached.dtype == np.float32
                and cached.ndim == 2
                and len(cached) == len(items)
                and np.isfinite(cached).all()
            ):
                return cached
        except (OSError, ValueError, EOFError):  # none yet, or damaged: compute it
            pass
        out = np.ascontiguousarray(compute(items), dtype=np.float32)
        buffer = io.BytesIO()
        np.save(buffer, out, allow_pickle=False)
        _keep(path, buffer.getvalue(), "canary reference")
        return out

    return reference


@dataclass(frozen=True)
class Verdict:
    """A provider's refusal by the canary, kept beside the references (``refused-<key>.json``):
    the same file compiled by the same runtime on the same CPU gives the same figure, so a load
    that reads one below its floor refuses the provider at once instead of compiling and
    probing it again on every start. A higher floor than the one it failed still refuses; a
    lower one lets the canary run again."""

    path: Path

    def read(self) -> float | None:
        """The smallest cosine kept, or None (none kept, or unreadable)."""
        try:
            cos = jsonio.read(self.path)["min_cosine"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return float(cos) if isinstance(cos, int | float) else None

    def write(self, min_cosine: float) -> None:
        _keep(self.path, json.dumps({"min_cosine": min_cosine}).encode(), "canary refusal")


def verdict(folder: Path, *parts: str) -> Verdict:
    """The verdict kept in ``folder`` (the model file's canary folder) for a provider, named by
    ``parts`` (its plan and the runtime's version)."""
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    return Verdict(folder / f"refused-{key}.json")


def _keep(path: Path, data: bytes, what: str) -> None:
    """Write ``data`` to ``path`` whole or not at all (a staging file renamed over it, for
    concurrent loaders too); an unwritable folder only logs."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.write_bytes(data)
        os.replace(staging, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            staging.unlink(missing_ok=True)
        log.warning("%s not kept in %s: %s", what, path.parent, exc)
