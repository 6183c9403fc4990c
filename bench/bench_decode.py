"""decode_mode exact vs fast: preprocessing time and embedding agreement on varied photos.

50 photo-like JPEGs (smooth scene + texture + sensor noise; 4000x3000, 3000x4000, 1920x1080,
1024x768, 640x480, quality 80-95), generated once into bench/data/photos-varied/. For each mode:
median decode+preprocess time per image, and the cosine between the two modes' embeddings on
the shipped demo model (and on the exported ViT-B/32 benchmark model when it exists). PNG and
WebP copies of six of them (12 MP and 1920x1080) measure the other formats' fast path (a whole-
factor box reduction before the bicubic resample) and join the cosine check.

Run: .venv/bin/python bench/bench_decode.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
from themis_clip.models.spec import ImageSpec
from themis_clip.preprocess.image import ImagePreprocessor

FOLDER = Path(__file__).resolve().parent / "data" / "photos-varied"
SIZES = [(4000, 3000), (3000, 4000), (1920, 1080), (1024, 768), (640, 480)]


def photo(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (h // 64 + 2, w // 64 + 2, 3), dtype=np.uint8))
    scene = np.asarray(base.resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    texture = 25 * np.sin(xx / (3 + seed % 5)) * np.cos(yy / (4 + seed % 7))
    noise = rng.normal(0, 6, (h, w, 1)).astype(np.float32)
    return Image.fromarray(np.clip(scene + texture[..., None] + noise, 0, 255).astype(np.uint8))


def photos(n: int = 50) -> list[Path]:
    FOLDER.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        path = FOLDER / f"{i:02d}.jpg"
        if not path.exists():
            w, h = SIZES[i % len(SIZES)]
            photo(w, h, i).save(path, quality=80 + (i * 3) % 16)
        out.append(path)
    return out


def other_formats() -> dict[str, list[Path]]:
    """PNG and WebP copies of six of the photos (12 MP portrait/landscape and 1920x1080)."""
    out: dict[str, list[Path]] = {"png": [], "webp": []}
    for i in (0, 1, 2, 5, 6, 7):
        src = FOLDER / f"{i:02d}.jpg"
        for fmt, kw in (("png", {"compress_level": 6}), ("webp", {"quality": 90})):
            path = FOLDER / "other" / f"{i:02d}.{fmt}"
            if not path.exists():
                path.parent.mkdir(exist_ok=True)
                Image.open(src).save(path, **kw)
            out[fmt].append(path)
    return out


def format_timings(sets: dict[str, list[Path]]) -> dict[str, dict[str, float]]:
    """Median decode+preprocess ms per format and mode (interleaved, 2 rounds)."""
    got: dict[str, dict[str, list[float]]] = {f: {"exact": [], "fast": []} for f in sets}
    for mode in ("exact", "fast", "exact", "fast"):
        prep = ImagePreprocessor(ImageSpec(image_size=224), decode_mode=mode)
        for fmt, files in sets.items():
            for f in files:
                data = f.read_bytes()
                t0 = time.perf_counter()
                prep(data)
                got[fmt][mode].append((time.perf_counter() - t0) * 1000)
    return {f: {m: float(np.median(v)) for m, v in d.items()} for f, d in got.items()}


def main() -> None:
    files = photos()
    data = [f.read_bytes() for f in files]
    timings: dict[str, list[float]] = {"exact": [], "fast": []}
    for mode in ("exact", "fast", "exact", "fast"):  # interleaved rounds
        prep = ImagePreprocessor(ImageSpec(image_size=224), decode_mode=mode)
        for d in data:
            t0 = time.perf_counter()
            prep(d)
            timings[mode].append((time.perf_counter() - t0) * 1000)
    big = [
        i
        for i, f in enumerate(files)
        if SIZES[int(f.stem) % len(SIZES)][0] * SIZES[int(f.stem) % len(SIZES)][1] >= 12e6
    ]
    med = {m: float(np.median(v)) for m, v in timings.items()}
    med12 = {
        m: float(np.median([v[i] for i in big] + [v[i + len(data)] for i in big]))
        for m, v in timings.items()
    }
    others = other_formats()
    per_format = format_timings(others)
    data += [f.read_bytes() for paths in others.values() for f in paths]
    models = {"demo (64 px)": demo_model_path()}
    hf = Path(__file__).resolve().parent / "models" / "hf-vit-b-32"
    if (hf / "manifest.json").exists():
        models["ViT-B/32 arch, random weights (224 px)"] = hf
    cosines = {}
    for name, path in models.items():
        emb = {}
        for mode in ("exact", "fast"):
            p = OnnxClipPlugin()
            assert p.initialize(
                PluginConfig.from_dict(
                    {"model": {"path": str(path)}, "preprocess": {"decode_mode": mode}}
                )
            )
            emb[mode] = np.stack([r.embedding for r in p.generate_embedding_batch(data)])
            p.shutdown()
        cos = np.sum(emb["exact"] * emb["fast"], axis=1)
        cosines[name] = (float(cos.min()), float(cos.mean()))
    print(
        f"{len(files)} JPEGs ({', '.join(f'{w}x{h}' for w, h in SIZES)}), decode+preprocess to 224 px, median ms:"
    )
    print(
        f"  all:   exact {med['exact']:.1f}, fast {med['fast']:.1f} (x{med['exact'] / med['fast']:.1f})"
    )
    print(
        f"  12 MP: exact {med12['exact']:.1f}, fast {med12['fast']:.1f} (x{med12['exact'] / med12['fast']:.1f})"
    )
    for fmt, m in per_format.items():
        print(
            f"  {fmt} (12 MP and 1920x1080): exact {m['exact']:.1f}, fast {m['fast']:.1f} "
            f"(x{m['exact'] / m['fast']:.1f})"
        )
    for name, (lo, mean) in cosines.items():
        print(
            f"  embedding cosine exact vs fast over all {len(data)} files, {name}: "
            f"min {lo:.5f}, mean {mean:.5f}"
        )
    print(
        json.dumps(
            {"median_ms": med, "median_ms_12mp": med12, "formats": per_format, "cosine": cosines}
        )
    )


if __name__ == "__main__":
    sys.exit(main())
