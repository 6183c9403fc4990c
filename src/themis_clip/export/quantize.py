"""Batch-independent int8 variants of a model directory, calibrated once.

``add_int8_variant(model_dir)`` quantises the fp32 towers with ONNX Runtime's static
quantisation (:func:`themis_clip.export.precision.quantize_int8_static`) and records the variant
in the manifest. Calibration: image tensors made by the model's own preprocessing from the images in
``calibration`` (a folder, searched recursively), or, without one, from a built-in synthetic set
(procedural photo-like images and rendered shape scenes, with a warning: ranges fitted to
synthetic images are a compromise for real photos; pass ~100 representative images); captions
from a built-in list of varied English sentences. ``dynamic=True`` writes ONNX Runtime's dynamic
quantisation instead (``int8-dynamic``: per-batch activation ranges, batch-dependent outputs).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import themis_clip.jsonio as jsonio
from themis_clip.config import PluginConfig
from themis_clip.errors import ExportError
from themis_clip.export.precision import quantize_int8_dynamic, quantize_int8_static
from themis_clip.files import walk_images
from themis_clip.interface import BackendType
from themis_clip.loading import load_model
from themis_clip.models.layout import MANIFEST_NAME, write_manifest

__all__ = ["CALIBRATION_CAPTIONS", "add_int8_variant", "calibration_images"]

log = logging.getLogger(__name__)

CALIBRATION_CAPTIONS = [
    "a photo of a dog",
    "a cat sleeping on a sofa",
    "a red car parked on the street at night",
    "two people walking on a beach at sunset",
    "a bowl of fresh fruit on a wooden table",
    "a mountain landscape with snow and a lake",
    "a city skyline with tall buildings",
    "a close-up of a flower",
    "a small red circle on the left",
    "a large blue square in the center",
    "an old black and white photograph of a family",
    "a screenshot of a spreadsheet",
    "a child playing football in a park",
    "a plate of pasta with tomato sauce",
    "a bird flying over the ocean",
    "a diagram explaining how a bicycle works",
    "a painting of a ship in a storm",
    "a green triangle and a yellow star",
    "people sitting in a crowded restaurant",
    "a laptop and a cup of coffee on a desk",
    "an aerial view of farmland",
    "a street sign that says stop",
    "a horse standing in a field",
    "the interior of a church with stained glass windows",
    "a selfie of a smiling woman",
    "a pile of autumn leaves",
    "a train crossing a bridge",
    "a blurry photo taken at a concert",
    "a dog",
    "sunset",
    "an extremely detailed macro photograph of the compound eye of a dragonfly, with "
    "iridescent colours and a soft green background, taken early in the morning",
    "text",
]


def calibration_images(count: int = 64, seed: int = 0) -> list[npt.NDArray[np.uint8]]:
    """The built-in calibration set: procedural photo-like images and rendered scenes."""
    from themis_clip.demo.scenes import random_scene, render_scene

    rng = np.random.default_rng(seed)
    out: list[npt.NDArray[np.uint8]] = []
    for i in range(count):
        if i % 2:
            out.append(np.asarray(render_scene(random_scene(rng), size=224, varied=True)))
            continue
        h, w = int(rng.integers(160, 320)), int(rng.integers(160, 320))
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack(
            [
                128
                + 90 * np.sin(xx / rng.uniform(5, 40) + c) * np.cos(yy / rng.uniform(5, 40) + 2 * c)
                for c in range(3)
            ],
            axis=-1,
        )
        noise = rng.normal(0, rng.uniform(3, 30), base.shape)
        out.append(np.clip(base + noise, 0, 255).astype(np.uint8))
    return out


def add_int8_variant(
    model_dir: Path,
    *,
    calibration: Path | None = None,
    dynamic: bool = False,
    batch: int = 8,
) -> str:
    """Quantise the fp32 towers of ``model_dir`` into a variant; return what it was calibrated on.

    Writes ``<tower>.int8.onnx`` (static) or ``<tower>.int8-dynamic.onnx`` and rewrites the
    manifest (variants and SHA-256 list).

    Raises:
        ValueError: ``calibration`` holds no images.
        ModelError: the model directory cannot be loaded (as :func:`load_model` raises it).
    """
    manifest_path = model_dir / MANIFEST_NAME
    manifest: dict[str, Any] = jsonio.read(manifest_path)
    name = "int8-dynamic" if dynamic else "int8"
    towers = {"visual": manifest["visual"]["file"]}
    if manifest.get("textual"):
        towers["textual"] = manifest["textual"]["file"]
    described = "no calibration (dynamic ranges)"
    feeds: dict[str, list[dict[str, npt.NDArray[Any]]]] = {}
    if not dynamic:
        feeds, described = _feeds(model_dir, towers, calibration, batch)
    files: dict[str, str] = {}
    for tower, file in towers.items():
        source = model_dir / file
        target = model_dir / f"{tower}.{name}.onnx"
        if dynamic:
            quantize_int8_dynamic(source, target)
        else:
            quantize_int8_static(source, target, feeds[tower])
        files[tower] = target.name
    variants = {**manifest.get("variants", {}), name: files}
    keep = {k: v for k, v in manifest.items() if k not in _WRITTEN}
    if not dynamic:
        keep["calibration"] = {**manifest.get("calibration", {}), name: described}
    write_manifest(
        model_dir,
        name=manifest["name"],
        embedding_dim=manifest["embedding_dim"],
        visual=manifest["visual"],
        textual=manifest.get("textual"),
        variants=variants,
        extra=keep,
    )
    return described


_WRITTEN = {
    "format",
    "format_version",
    "name",
    "embedding_dim",
    "visual",
    "textual",
    "variants",
    "files",
}


def _feeds(
    model_dir: Path, towers: dict[str, str], calibration: Path | None, batch: int
) -> tuple[dict[str, list[dict[str, npt.NDArray[Any]]]], str]:
    import onnx

    # The fp32 model's own preprocessor, tokenizer and sessions say how each tower is fed.
    model = load_model(PluginConfig.from_dict({"model": {"path": str(model_dir)}}), BackendType.CPU)
    try:
        if calibration is not None:
            paths = walk_images(calibration)
            if not paths:
                raise ExportError(f"no images under {calibration} to calibrate on")
            images: list[Any] = list(paths)
            described = f"{len(paths)} images from {calibration.name}"
        else:
            images = list(calibration_images())
            described = f"the built-in synthetic set ({len(images)} generated images)"
            log.warning(
                "int8 ranges calibrated on %s; for real photos pass --calibration DIR with about "
                "100 representative images",
                described,
            )
        pixels = []
        for image in images:
            try:
                pixels.append(model.preprocessor(image))
            except Exception as exc:  # an unreadable calibration file is skipped, not fatal
                log.warning("calibration image skipped: %s", exc)
        if not pixels:
            raise ExportError("no calibration image could be decoded")
        if len(pixels) < len(images):  # the manifest must say what was really used
            described += f" ({len(images) - len(pixels)} unreadable, skipped)"
        inputs = {
            tower: onnx.load(str(model_dir / file), load_external_data=False).graph.input[0].name
            for tower, file in towers.items()
        }
        stack = np.stack(pixels)
        feeds: dict[str, list[dict[str, npt.NDArray[Any]]]] = {
            "visual": [
                {inputs["visual"]: stack[i : i + batch]} for i in range(0, len(stack), batch)
            ]
        }
        if "textual" in towers:
            text = model.textual
            if text is None:
                raise ExportError(f"{model_dir}: the manifest names a text tower the model lacks")
            rows = [list(r) for r in text.tokenizer.encode_batch(CALIBRATION_CAPTIONS, None).rows]
            text_feeds = []
            for i in range(0, len(rows), batch):
                part = rows[i : i + batch]
                # padded as the model runs: to the longest row (CLIP: with the end token, as
                # before) or to the full context (SigLIP), plus the mask where the graph takes one
                if text.tokenizer.pad_to_context:
                    ids, mask = text.tokenizer.pad(
                        part, text.tokenizer.context_length, np.dtype(np.int64)
                    )
                elif text.mask is not None:
                    ids, mask = text.tokenizer.pad(
                        part, max(len(r) for r in part), np.dtype(np.int64)
                    )
                else:
                    length = max(len(r) for r in part)
                    ids = np.zeros((len(part), length), dtype=np.int64)
                    for j, row in enumerate(part):
                        ids[j, :] = row[-1]
                        ids[j, : len(row)] = row
                    mask = None
                feed = {text.ids.name: ids.astype(np.dtype(text.ids.dtype))}
                if text.mask is not None and mask is not None:
                    feed[text.mask.name] = mask.astype(np.dtype(text.mask.dtype))
                text_feeds.append(feed)
            feeds["textual"] = text_feeds
            described += f" and {len(rows)} built-in captions"
        return feeds, described
    finally:
        model.retire(timeout_s=0)
