"""Model-only ViT-B/32 throughput against this CPU's measured fp32 GEMM peak (issue 30, item 2).

The peak is a large single-precision matrix product through the BLAS NumPy ships, on the same
thread count ONNX Runtime gets. The model's rate is its analytic FLOPs (8.82 GFLOP per 224 px
image for ViT-B/32: patch embedding, 12 blocks of QKV / attention / output / MLP, projection) times
images per second. Session variants are timed interleaved, round by round, median reported, so the
noise of a shared machine hits every variant alike.

Usage: OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 .venv/bin/python bench/bench_model_peak.py
       [--model bench/models/hf-vit-b-32] [--rounds 5] [--batch 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent


def vit_flops(
    *, image: int = 224, patch: int = 32, width: int = 768, layers: int = 12, dim: int = 512
) -> float:
    """Multiply-add FLOPs (2 per MAC) of one image through a CLIP ViT image tower."""
    n_patch = (image // patch) ** 2
    tokens = n_patch + 1
    per_layer = 2 * tokens * (4 * width * width + 2 * width * 4 * width)  # qkv, out, mlp
    per_layer += 2 * 2 * tokens * tokens * width  # q·k and attn·v
    embed = 2 * n_patch * (3 * patch * patch) * width
    return float(layers * per_layer + embed + 2 * width * dim)


def cpu_line() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    keep = [f for f in flags if f.startswith(("avx512", "avx_vnni", "amx", "fma", "avx2"))]
    return (
        f"{fields.get('Model name', '?').strip()} ({os.cpu_count()} CPUs), flags: {' '.join(keep)}"
    )


def gemm_gflops(n: int = 2048, rounds: int = 7) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / min(times) / 1e9


def session(path: Path, threads: int, **kw: object) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = kw.pop("level", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)  # type: ignore[assignment]
    for key, value in kw.pop("entries", {}).items():  # type: ignore[attr-defined]
        opts.add_session_config_entry(key, value)
    if "mem_pattern" in kw:
        opts.enable_mem_pattern = bool(kw.pop("mem_pattern"))
    if "save" in kw:
        opts.optimized_model_filepath = str(kw.pop("save"))
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(HERE / "models" / "hf-vit-b-32"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    folder = Path(args.model)
    fp32 = folder / "visual.onnx"
    print(cpu_line())
    print(f"onnxruntime {ort.__version__}, numpy {np.__version__}")
    flops = vit_flops()
    print(f"ViT-B/32 image tower: {flops / 1e9:.2f} GFLOP per image")

    tmp = Path(tempfile.mkdtemp(prefix="peak-"))
    optimised = tmp / "visual.opt.onnx"
    session(fp32, args.threads, save=optimised)  # writes the optimised graph once
    spin_off = {"session.intra_op.allow_spinning": "0"}
    variants: dict[str, Callable[[], ort.InferenceSession]] = {
        "default (ENABLE_ALL)": lambda: session(fp32, args.threads),
        "basic level": lambda: session(
            fp32, args.threads, level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        ),
        "saved optimised model": lambda: session(
            optimised, args.threads, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ),
        "no spinning": lambda: session(fp32, args.threads, entries=spin_off),
        "no mem pattern": lambda: session(fp32, args.threads, mem_pattern=False),
        "NCHWc off (level EXTENDED)": lambda: session(
            fp32, args.threads, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        ),
    }
    for name in ("int8", "fp16"):
        path = folder / f"visual.{name}.onnx"
        if path.exists():
            variants[f"{name} variant"] = lambda p=path: session(p, args.threads)  # type: ignore[misc]
    sessions = {k: make() for k, make in variants.items()}
    name_in = {k: s.get_inputs()[0].name for k, s in sessions.items()}
    pixels = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224), dtype=np.float32)
    one = pixels[:1]
    for k, s in sessions.items():
        s.run(None, {name_in[k]: pixels})
        s.run(None, {name_in[k]: one})
    rates: dict[str, list[float]] = {k: [] for k in sessions}
    lat1: dict[str, list[float]] = {k: [] for k in sessions}
    peaks: list[float] = []
    for _ in range(args.rounds):
        peaks.append(gemm_gflops())
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, {name_in[k]: pixels})
            rates[k].append(args.batch / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            s.run(None, {name_in[k]: one})
            lat1[k].append((time.perf_counter() - t0) * 1e3)
    peak = statistics.median(peaks)
    print(
        f"fp32 GEMM peak (2048^3 numpy matmul, best of 7, median of {args.rounds}): {peak:.0f} GFLOP/s"
    )
    print(f"{'variant':30s} {'img/s':>7s} {'GFLOP/s':>8s} {'÷peak':>6s} {'b1 ms':>7s}")
    for k in sessions:
        r = statistics.median(rates[k])
        print(
            f"{k:30s} {r:7.1f} {r * flops / 1e9:8.0f} {r * flops / 1e9 / peak:6.2f} "
            f"{statistics.median(lat1[k]):7.1f}"
        )


if __name__ == "__main__":
    main()
