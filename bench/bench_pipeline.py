"""End-to-end pipeline benchmark: files -> embeddings, this project vs transformers, and ceilings.

Same random ViT-B/32 weights everywhere (a transformers CLIPModel checkpoint and its export by
``themis-clip export``), same inputs, every engine in its own process (ONNX Runtime and PyTorch
slow each other down in one process), interleaved rounds, medians:

* ours fp32 / ours int8: ``OnnxClipPlugin.generate_embedding_batch(paths)`` (decode_mode fast);
* transformers: PIL decode + ``CLIPImageProcessor`` + ``CLIPModel.get_image_features`` (eager);
* model-only: the exported image tower on pre-made tensors (batch 1, 8, 32): the ceiling;
* GEMM peak: float32 matmul in numpy with the same 2 threads: the physical limit
  (8.82 GFLOP per ViT-B/32 image).
Text: 2,000 captions (default 500) through both pipelines.

Run: .venv/bin/python bench/bench_pipeline.py [--full]   (--full: 200 + 200 images, 2000 captions)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import photo
from make_models import MODELS, ensure_exported

DATA = Path(__file__).resolve().parent / "data"
GFLOP_PER_IMAGE = 8.82

ENGINE = r"""
import json, sys, time, glob
import numpy as np
kind, engine, model, ckpt, folder, n_text = sys.argv[1:7]
files = sorted(glob.glob(folder + "/*.jpg")) if kind == "image" else []
captions = [line for line in open(folder).read().splitlines()][: int(n_text)] if kind == "text" else []
def timed(fn, n):
    fn(8)  # warm up
    t = time.perf_counter(); fn(n); return n / (time.perf_counter() - t)
if engine in ("ours", "ours-int8"):
    from themis_clip import OnnxClipPlugin, PluginConfig
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": model, "variant": "int8" if engine == "ours-int8" else None}, "max_batch_size": 32}))
    if kind == "image":
        rate = timed(lambda n: [r.embedding for r in p.generate_embedding_batch(files[:n])], len(files))
    else:
        rate = timed(lambda n: p.generate_text_embedding_batch(captions[:n]), len(captions))
elif engine == "transformers":
    import torch
    torch.set_num_threads(2)
    from PIL import Image
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel
    m = CLIPModel.from_pretrained(ckpt).eval()
    if kind == "image":
        proc = CLIPImageProcessor.from_pretrained(ckpt)
        def run(n):
            for s in range(0, n, 32):
                imgs = [Image.open(f).convert("RGB") for f in files[s:min(n, s + 32)]]
                with torch.no_grad():
                    m.get_image_features(**proc(images=imgs, return_tensors="pt"))
        rate = timed(run, len(files))
    else:
        tok = AutoTokenizer.from_pretrained(ckpt)
        def run(n):
            for s in range(0, n, 32):
                enc = tok(captions[s:min(n, s + 32)], padding=True, truncation=True, max_length=77, return_tensors="pt")
                with torch.no_grad():
                    m.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        rate = timed(run, len(captions))
elif engine.startswith("model-only"):
    from themis_clip import OnnxClipPlugin, PluginConfig
    b = int(engine.split("-b")[1])
    p = OnnxClipPlugin()
    variant = "int8" if "int8" in engine else None
    assert p.initialize(PluginConfig.from_dict({"model": {"path": model, "variant": variant}, "max_batch_size": b}))
    x = np.random.default_rng(0).standard_normal((b, 3, 224, 224), dtype=np.float32)
    run = p._model.visual.run
    run(x)
    t = time.perf_counter(); k = max(1, 64 // b)
    for _ in range(k): run(x)
    rate = k * b / (time.perf_counter() - t)
elif engine == "gemm":
    a = np.random.rand(2048, 2048).astype(np.float32); c = np.random.rand(2048, 2048).astype(np.float32)
    a @ c; t = time.perf_counter()
    for _ in range(10): a @ c
    rate = 10 * 2 * 2048**3 / (time.perf_counter() - t) / 1e9
print(json.dumps({"rate": rate}))
"""


def run_engine(kind: str, engine: str, model: Path, ckpt: Path, folder: Path, n_text: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            ENGINE,
            kind,
            engine,
            str(model),
            str(ckpt),
            str(folder),
            str(n_text),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode:
        raise RuntimeError(f"{engine}: {out.stderr[-1500:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rate"])


def images(folder: Path, n: int, size: tuple[int, int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        path = folder / f"{i:03d}.jpg"
        if not path.exists():
            photo(*size, 1000 + i).save(path, quality=88)
    for extra in sorted(folder.glob("*.jpg"))[n:]:
        extra.unlink()
    return folder


def captions(path: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    words = [
        "a",
        "photo",
        "of",
        "the",
        "dog",
        "cat",
        "man",
        "woman",
        "child",
        "car",
        "street",
        "house",
        "tree",
        "beach",
        "mountain",
        "city",
        "night",
        "red",
        "blue",
        "green",
        "small",
        "large",
        "old",
        "new",
        "running",
        "sitting",
        "standing",
        "under",
        "near",
        "with",
        "and",
        "in",
        "on",
    ]
    lines = [" ".join(rng.choice(words, size=int(rng.integers(3, 40)))) for _ in range(n)]
    path.write_text("\n".join(lines))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n12, n640, ntext = (200, 200, 2000) if args.full else (24, 64, 500)
    model = ensure_exported("hf-vit-b-32")
    ckpt = MODELS / "hf-vit-b-32-checkpoint"
    sets = {
        "12 MP": images(DATA / f"jpeg-4000x3000-{n12}", n12, (4000, 3000)),
        "640x480": images(DATA / f"jpeg-640x480-{n640}", n640, (640, 480)),
    }
    text = captions(DATA / "captions.txt", ntext)
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for name, folder in sets.items():
            for engine in ("ours", "ours-int8", "transformers"):
                results.setdefault(name, {}).setdefault(engine, []).append(
                    run_engine("image", engine, model, ckpt, folder, 0)
                )
        for engine in ("ours", "transformers"):
            results.setdefault("captions", {}).setdefault(engine, []).append(
                run_engine("text", engine, model, ckpt, text, ntext)
            )
        for engine in (
            "model-only-b1",
            "model-only-b8",
            "model-only-b32",
            "model-only-int8-b32",
            "gemm",
        ):
            results.setdefault("ceiling", {}).setdefault(engine, []).append(
                run_engine("model", engine, model, ckpt, DATA, 0)
            )
    med = {k: {e: float(np.median(v)) for e, v in d.items()} for k, d in results.items()}
    ceiling = med["ceiling"]
    best = max(ceiling[f"model-only-b{b}"] for b in (1, 8, 32))
    peak = ceiling["gemm"] / GFLOP_PER_IMAGE
    print(
        f"GEMM peak {ceiling['gemm']:.0f} GFLOP/s = {peak:.1f} img/s; model-only fp32 b1/b8/b32 "
        f"{ceiling['model-only-b1']:.1f}/{ceiling['model-only-b8']:.1f}/{ceiling['model-only-b32']:.1f} img/s "
        f"(best x{best / peak:.2f} of peak); int8 b32 {ceiling['model-only-int8-b32']:.1f} "
        f"(x{ceiling['model-only-int8-b32'] / ceiling['model-only-b32']:.2f} fp32)"
    )
    for name in sets:
        r = med[name]
        print(
            f"{name} ({n12 if name == '12 MP' else n640} files): ours {r['ours']:.1f} img/s, int8 {r['ours-int8']:.1f}, "
            f"transformers {r['transformers']:.1f} -> x{r['ours'] / r['transformers']:.2f} "
            f"(int8 x{r['ours-int8'] / r['transformers']:.2f}); ours / model-only x{r['ours'] / best:.2f}"
        )
    t = med["captions"]
    print(
        f"captions ({ntext}): ours {t['ours']:.0f}/s, transformers {t['transformers']:.0f}/s "
        f"-> x{t['ours'] / t['transformers']:.2f}"
    )
    print(json.dumps(med))


if __name__ == "__main__":
    main()
