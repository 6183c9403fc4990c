"""Build the benchmark models (random weights, CLIP architecture) into bench/models/ (cached).

Usage: .venv/bin/python bench/make_models.py [vit-b-32] [vit-l-14]
"""

from __future__ import annotations

import sys
from pathlib import Path

from themis_clip.export.vit import VIT_B_32, VIT_L_14, ViTSpec, build_vit_visual

MODELS = Path(__file__).resolve().parent / "models"
SPECS: dict[str, ViTSpec] = {"vit-b-32": VIT_B_32, "vit-l-14": VIT_L_14}


def ensure(name: str, seed: int = 0) -> Path:
    """Path of ``<name>[-seed]/visual.onnx``, built on first use."""
    folder = MODELS / (name if seed == 0 else f"{name}-seed{seed}")
    path = folder / "visual.onnx"
    if not path.exists():
        spec = SPECS[name]
        build_vit_visual(ViTSpec(**{**spec.__dict__, "seed": seed}), path)
    return path


if __name__ == "__main__":
    for name in sys.argv[1:] or ["vit-b-32"]:
        print(ensure(name))
