"""Deterministic (static) int8 against fp32 and the old dynamic int8, side by side in one run.

Part A, the shipped demo model (trained weights): cosine to fp32 over 100 fresh scenes and 100
captions, and batch independence (each item alone vs inside a batch of 32).
Part B, the benchmark ViT-B/32 image tower (random weights, ``make_models.py vit-b-32``):
model-only throughput at batch 1/8/32 (2 interleaved rounds, best of each), cosine to fp32 on
32 held-out images, batch independence, and RSS of a process that loads and runs each variant.
Part C: end-to-end 640x480 JPEGs through ``OnnxClipPlugin`` with each variant.

Run: .venv/bin/python bench/bench_int8.py [--quick]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_models import ensure

from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
from themis_clip.demo.scenes import random_scene, render_scene
from themis_clip.export.precision import quantize_int8_dynamic, quantize_int8_static
from themis_clip.export.quantize import CALIBRATION_CAPTIONS, calibration_images

# Peak RSS from /proc (VmHWM): ru_maxrss would carry the parent's peak across fork + exec.
RSS = r"""
import sys, numpy as np
from themis_clip import OnnxClipPlugin, PluginConfig
p = OnnxClipPlugin()
assert p.initialize(PluginConfig.from_dict({"model": {"path": sys.argv[1]}}))
p.embed_pixels(np.zeros((32, 3, 224, 224), np.float32))
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM")][0]
print(int(hwm.split()[1]) // 1024)
"""


def plugin(path: str, variant: str | None = None) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    cfg = {"model": {"path": path, "variant": variant}, "max_batch_size": 32}
    assert p.initialize(PluginConfig.from_dict(cfg)), p.last_error
    return p


def min_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(a * b, axis=1)))


def part_a() -> dict[str, object]:
    rng = np.random.default_rng(123)
    scenes = [np.asarray(render_scene(random_scene(rng), size=224)) for _ in range(100)]
    words = ["red", "green", "blue", "yellow", "circle", "square", "star", "ring", "small", "large"]
    captions = [
        f"a {rng.choice(words)} {rng.choice(words)} {rng.choice(words)}" for _ in range(100)
    ]
    out: dict[str, object] = {}
    ref = plugin(str(demo_model_path()))
    ref_i = np.stack([r.embedding for r in ref.generate_embedding_batch(scenes)])
    ref_t = np.stack([r.embedding for r in ref.generate_text_embedding_batch(captions)])
    for variant in ("int8", "int8-dynamic"):
        p = plugin(str(demo_model_path()), variant)
        got_i = np.stack([r.embedding for r in p.generate_embedding_batch(scenes)])
        got_t = np.stack([r.embedding for r in p.generate_text_embedding_batch(captions)])
        alone = np.stack([p.generate_embedding(s).embedding for s in scenes[:32]])
        alone_t = np.stack([p.generate_text_embedding(c).embedding for c in captions[:32]])
        out[variant] = {
            "image_cos_min": min_cos(got_i, ref_i),
            "text_cos_min": min_cos(got_t, ref_t),
            "image_batch_independent": bool(np.array_equal(alone, got_i[:32])),
            "text_batch_independent": bool(np.array_equal(alone_t, got_t[:32])),
            "image_alone_vs_batch_cos_min": min_cos(alone, got_i[:32]),
        }
    return out


def part_b(work: Path, rounds: int) -> dict[str, object]:
    fp32 = ensure("vit-b-32")
    ref = plugin(str(fp32))
    pixels = np.stack([ref.preprocess(i) for i in calibration_images(96, seed=1)])
    calib, held = pixels[:64], pixels[64:]
    files = {"fp32": fp32, "int8": work / "vit-int8.onnx", "int8-dynamic": work / "vit-dyn.onnx"}
    t0 = time.perf_counter()
    quantize_int8_static(
        fp32, files["int8"], [{"pixel_values": calib[i : i + 8]} for i in range(0, 64, 8)]
    )
    static_s = time.perf_counter() - t0
    quantize_int8_dynamic(fp32, files["int8-dynamic"])
    plugins = {k: plugin(str(v)) for k, v in files.items()}
    ref_out = plugins["fp32"].embed_pixels(held)
    result: dict[str, object] = {"static_quantisation_s": static_s}
    speed: dict[str, dict[int, float]] = {k: {} for k in files}
    for _ in range(rounds):
        for batch in (1, 8, 32):
            x = np.ascontiguousarray(np.resize(held, (batch, *held.shape[1:])))
            for name, p in plugins.items():
                p.embed_pixels(x)
                n = max(2, 64 // batch)
                t = time.perf_counter()
                for _ in range(n):
                    p.embed_pixels(x)
                speed[name][batch] = max(
                    speed[name].get(batch, 0.0), n * batch / (time.perf_counter() - t)
                )
    for name, p in plugins.items():
        got = p.embed_pixels(held)
        alone = np.concatenate([p.embed_pixels(held[i : i + 1]) for i in range(len(held))])
        rss = int(
            subprocess.run(
                [sys.executable, "-c", RSS, str(files[name])],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        result[name] = {
            "img_s": speed[name],
            "best_img_s": max(speed[name].values()),
            "cos_to_fp32_min": min_cos(got, ref_out),
            "batch_independent": bool(np.array_equal(alone, got)),
            "rss_mib": rss,
            "file_mib": round(files[name].stat().st_size / 2**20, 1),
        }
    best = {k: result[k]["best_img_s"] for k in files}  # type: ignore[index]
    result["ratio_int8_vs_fp32_best"] = best["int8"] / best["fp32"]
    result["ratio_dynamic_vs_fp32_best"] = best["int8-dynamic"] / best["fp32"]
    result["_files"] = {k: str(v) for k, v in files.items()}
    return result


def part_c(files: dict[str, str], rounds: int) -> dict[str, float]:
    from PIL import Image

    rng = np.random.default_rng(3)
    jpegs = []
    for i in range(64):
        yy, xx = np.mgrid[0:480, 0:640]
        base = np.stack(
            [128 + 90 * np.sin(xx / (9 + i % 7) + c) * np.cos(yy / (13 + c)) for c in range(3)], -1
        )
        buf = io.BytesIO()
        Image.fromarray(
            np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        ).save(buf, "JPEG", quality=90)
        jpegs.append(buf.getvalue())
    plugins = {k: plugin(v) for k, v in files.items()}
    rate = dict.fromkeys(files, 0.0)
    for _ in range(rounds):
        for name, p in plugins.items():
            p.generate_embedding_batch(jpegs[:8])
            t = time.perf_counter()
            assert all(r.ok for r in p.generate_embedding_batch(jpegs))
            rate[name] = max(rate[name], len(jpegs) / (time.perf_counter() - t))
    return {
        **{f"{k}_img_s": v for k, v in rate.items()},
        "ratio_int8_vs_fp32": rate["int8"] / rate["fp32"],
        "ratio_dynamic_vs_fp32": rate["int8-dynamic"] / rate["fp32"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="1 round instead of 2")
    args = parser.parse_args()
    rounds = 1 if args.quick else 2
    work = Path(tempfile.mkdtemp(prefix="bench-int8-"))
    try:
        a = part_a()
        print("A demo model:", json.dumps(a), flush=True)
        b = part_b(work, rounds)
        files = b.pop("_files")
        print("B ViT-B/32 model-only:", json.dumps(b), flush=True)
        c = part_c(files, rounds)  # type: ignore[arg-type]
        print("C 640x480 JPEGs end-to-end:", json.dumps(c), flush=True)
        print(f"calibration captions: {len(CALIBRATION_CAPTIONS)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
