"""Parity of an exported model directory against its PyTorch reference checkpoint.

Embeds a fixed set of images (generated scenes and noise, several sizes) and texts (short to
over-long) with every precision variant in the directory, and with the ``transformers``
reference on the *same* preprocessed tensors and token ids, so the comparison isolates the
exported graph. Thresholds: cosine ≥ 0.99999 (fp32), ≥ 0.999 (fp16), ≥ 0.99 (int8).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import themis_clip.jsonio as jsonio
from themis_clip.config import PluginConfig
from themis_clip.demo.scenes import COLOURS, SHAPES, Scene, render_scene
from themis_clip.errors import ModelError
from themis_clip.export.hf import family_of, load_reference, reference_features
from themis_clip.plugin import OnnxClipPlugin

__all__ = ["THRESHOLDS", "VerifyRow", "verify_model"]

THRESHOLDS = {"fp32": 0.99999, "fp16": 0.999, "int8": 0.99, "int8-dynamic": 0.99}
TEXTS = [
    "a red circle",
    "a small blue triangle on the left",
    "a photo of a large yellow star in the center of the picture",
    "",
    "green " * 120,
    "a purple ring",
]


@dataclass(frozen=True, kw_only=True)
class VerifyRow:
    variant: str
    modality: str
    items: int
    min_cosine: float
    max_abs_diff: float
    threshold: float
    cosine_to_fp32: float = 1.0
    batch_independent: bool = True

    @property
    def ok(self) -> bool:
        return self.min_cosine >= self.threshold


def _images() -> list[np.ndarray]:
    out = [
        np.asarray(render_scene(Scene(shape=s, colour=c, seed=i), size=200 + 17 * i))
        for i, (s, c) in enumerate(zip(SHAPES, list(COLOURS), strict=False))
    ]
    rng = np.random.default_rng(0)
    out += [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((64, 300), (480, 640))]
    return out


def _normalize(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _features(out: object) -> np.ndarray:
    tensor = out if torch.is_tensor(out) else out.pooler_output  # type: ignore[attr-defined]
    return _normalize(tensor.numpy().astype(np.float64))


def verify_model(model_dir: Path, checkpoint: Path) -> list[VerifyRow]:
    """Compare every variant in ``model_dir`` with the reference ``checkpoint``."""
    manifest = jsonio.read(model_dir / "manifest.json")
    variants = ["fp32", *manifest.get("variants", {})]
    reference = load_reference(checkpoint)
    family = family_of(checkpoint)
    images = _images()
    rows: list[VerifyRow] = []
    fp32: dict[str, np.ndarray] = {}
    for variant in variants:
        plugin = OnnxClipPlugin()
        config = PluginConfig.from_dict({"model": {"path": str(model_dir), "variant": variant}})
        if not plugin.initialize(config):
            raise ModelError(f"cannot load variant {variant}: {plugin.last_error}")
        got_img = np.stack([r.embedding for r in plugin.generate_embedding_batch(images)])  # type: ignore[misc]
        pixels = np.stack([plugin.preprocess(i) for i in images])
        tokens = plugin.tokenize(TEXTS)
        got_txt = np.stack([r.embedding for r in plugin.generate_text_embedding_batch(TEXTS)])  # type: ignore[misc]
        # Batch independence: each item alone must give the very bits it gave inside the batch.
        alone_img = np.stack([plugin.generate_embedding(i).embedding for i in images])  # type: ignore[misc]
        alone_txt = np.stack([plugin.generate_text_embedding(t).embedding for t in TEXTS])  # type: ignore[misc]
        independent = {
            "image": bool(np.array_equal(alone_img, got_img)),
            "text": bool(np.array_equal(alone_txt, got_txt)),
        }
        if variant == "fp32":
            fp32 = {"image": got_img, "text": got_txt}
        textual = manifest.get("textual", {})
        with torch.no_grad():
            img, txt = reference_features(
                reference,
                family,
                torch.from_numpy(pixels),
                tokens,
                pad_id=int(textual.get("pad_id") or 0),
                context_length=int(textual.get("context_length") or 77),
            )
            ref_img, ref_txt = _features(img), _features(txt)
        for modality, got, ref in (("image", got_img, ref_img), ("text", got_txt, ref_txt)):
            cos = np.sum(got * ref, axis=1)
            rows.append(
                VerifyRow(
                    variant=variant,
                    modality=modality,
                    items=len(got),
                    min_cosine=float(cos.min()),
                    max_abs_diff=float(np.abs(got - ref).max()),
                    threshold=THRESHOLDS.get(variant, 0.99),
                    cosine_to_fp32=float(np.sum(got * fp32[modality], axis=1).min()),
                    batch_independent=independent[modality],
                )
            )
        plugin.shutdown()
    return rows
