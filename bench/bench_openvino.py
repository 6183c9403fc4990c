"""Model-only speed on the CPU at hand: ONNX Runtime's CPU provider in fp32, our static and
dynamic int8 variants, OpenVINO (its own runtime, on the same ONNX file) in f32 and in its
default precision (bf16 on AMX or AVX-512 BF16), and ours under AUTO (what a new user gets), side by side in one run; then where an
image's time goes under AUTO (decode + resize/normalise vs model) at 1024x768 and 12 MP, and the
text tower's latency at batch 1.

Prints the CPU's model line and flags and the provider AUTO chose. OpenVINO rows say why they
are missing where the ``openvino`` package is not installed.

Run: .venv/bin/python bench/bench_openvino.py [--rounds N]   (builds make_models.py vit-b-32)
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_models import ensure

from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
from themis_clip.export.precision import quantize_int8_dynamic, quantize_int8_static
from themis_clip.export.quantize import calibration_images
from themis_clip.runtime import openvino_devices

BATCHES = (1, 32)


def cpu_lines() -> list[str]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if line.startswith(("Model name", "Flags"))]


def plugin(path: Path, **config: object) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(path)}, **config})), (
        p.last_error
    )
    return p


def openvino_session(path: Path, precision: str | None) -> Callable[[np.ndarray], np.ndarray]:
    """The ONNX file compiled by OpenVINO for its CPU device (independent of our loader)."""
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": precision} if precision else {}
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    request = compiled.create_infer_request()

    def run(x: np.ndarray) -> np.ndarray:
        out = np.array(request.infer({0: x})[compiled.output(0)], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    return run


def min_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(a.astype(np.float64) * b, axis=1)))


def model_only(work: Path, rounds: int) -> dict[str, object]:
    fp32 = ensure("vit-b-32")
    ref = plugin(fp32, backend="cpu")
    pixels = np.stack([ref.preprocess(i) for i in calibration_images(96, seed=1)])
    calib, held = pixels[:64], pixels[64:]
    int8, dyn = work / "vit-int8.onnx", work / "vit-dyn.onnx"
    quantize_int8_static(fp32, int8, [{"pixel_values": calib[i : i + 8]} for i in range(0, 64, 8)])
    quantize_int8_dynamic(fp32, dyn)
    auto = plugin(fp32)
    engines: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "ort-cpu-fp32": ref.embed_pixels,
        "ort-int8-static (ours)": plugin(int8, backend="cpu").embed_pixels,
        "ort-int8-dynamic": plugin(dyn, backend="cpu").embed_pixels,
    }
    missing: dict[str, str] = {}
    if "CPU" in openvino_devices():
        engines["openvino-f32"] = openvino_session(fp32, "f32")
        engines["openvino-default"] = openvino_session(fp32, None)
    else:
        why = "OpenVINO is not installed (pip install 'themis-onnx-clip[openvino]')"
        missing = {"openvino-f32": why, "openvino-default": why}
    stats = auto.get_statistics()
    engines[f"ours-auto ({stats['backend']} {stats['precision']})"] = auto.embed_pixels
    speed: dict[str, dict[int, float]] = {k: {} for k in engines}
    for _ in range(rounds):  # interleaved: every engine sees the same machine state
        for batch in BATCHES:
            x = np.ascontiguousarray(np.resize(held, (batch, *held.shape[1:])))
            for name, run in engines.items():
                run(x)
                n = max(3, 64 // batch)
                t = time.perf_counter()
                for _ in range(n):
                    run(x)
                speed[name][batch] = max(
                    speed[name].get(batch, 0.0), n * batch / (time.perf_counter() - t)
                )
    ref_out = ref.embed_pixels(held)
    fastest = max(s[32] for s in speed.values())
    rows = {
        name: {
            "img_s_b32": round(speed[name][32], 1),
            "ms_b1": round(1000 / speed[name][1], 1),
            "ratio_to_fastest_b32": round(speed[name][32] / fastest, 3),
            "min_cos_to_cpu_fp32": round(min_cos(run(held), ref_out), 6),
        }
        for name, run in engines.items()
    }
    return {"engines": rows, "missing": missing, "auto_providers": stats["providers"]}


def jpeg(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [128 + 100 * np.sin(xx / (37 + 9 * c) + seed) * np.cos(yy / (53 + c)) for c in range(3)], -1
    )
    arr = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def split(model: Path, rounds: int) -> dict[str, object]:
    """Per image under AUTO: decode + resize/normalise (each decode mode) vs the model at batch 32."""
    out: dict[str, object] = {}
    for label, (w, h) in {"1024x768": (1024, 768), "12MP": (4000, 3000)}.items():
        images = [jpeg(w, h, s) for s in range(8)]
        row: dict[str, float] = {}
        for mode in ("exact", "fast", "draft"):
            p = plugin(model, preprocess={"decode_mode": mode})
            best = float("inf")
            for _ in range(rounds):
                t = time.perf_counter()
                pixels = np.stack([p.preprocess(b) for b in images])
                best = min(best, (time.perf_counter() - t) / len(images))
            row[f"decode_resize_ms_{mode}"] = round(best * 1000, 2)
            p.shutdown()
        p = plugin(model)
        x = np.ascontiguousarray(np.resize(pixels, (32, *pixels.shape[1:])))
        p.embed_pixels(x)
        t = time.perf_counter()
        for _ in range(rounds):
            p.embed_pixels(x)
        row["model_ms_per_image_b32"] = round((time.perf_counter() - t) / (rounds * 32) * 1000, 2)
        out[label] = row
    return out


def text_latency(rounds: int) -> dict[str, object]:
    """The text tower at batch 1 under AUTO (the shipped demo model and, if built, hf-vit-b-32)."""
    out: dict[str, object] = {}
    candidates = {
        "demo": demo_model_path(),
        "hf-vit-b-32": Path(__file__).parent / "models" / "hf-vit-b-32",
    }
    for name, path in candidates.items():
        if not path.exists():
            out[name] = "not built (bench/make_models.py hf-vit-b-32)"
            continue
        p = plugin(path)
        p.generate_text_embedding("warm up")
        times = []
        for i in range(max(50, rounds * 25)):
            t = time.perf_counter()
            p.generate_text_embedding(f"a photo of a dog number {i}")
            times.append((time.perf_counter() - t) * 1000)
        stats = p.get_statistics()
        out[name] = {
            "backend": f"{stats['backend']} {stats['precision']}",
            "p50_ms": round(statistics.median(times), 2),
        }
        p.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for line in cpu_lines():
        print(line)
    print("OpenVINO devices:", ", ".join(openvino_devices()) or "none")
    with tempfile.TemporaryDirectory() as tmp:
        result = {
            "model_only_vit_b_32": model_only(Path(tmp), args.rounds),
            "split_under_auto": split(ensure("vit-b-32"), args.rounds),
            "text_b1_under_auto": text_latency(args.rounds),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
