"""The GPU check behind ``bench/gpu_check.sh`` (see there); prints one JSON line per case."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_models import ensure


def main() -> None:
    import onnx
    import onnxruntime as ort

    from themis_clip.export.precision import to_float16

    available = ort.get_available_providers()
    print(json.dumps({"onnxruntime": ort.__version__, "providers": available}), flush=True)
    if "CUDAExecutionProvider" not in available:
        raise SystemExit("no CUDAExecutionProvider: install onnxruntime-gpu on a CUDA machine")
    fp32 = ensure("vit-b-32")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    fp16 = work / "visual.fp16.onnx"
    onnx.save(to_float16(onnx.load(str(fp32))), str(fp16))
    rng = np.random.default_rng(0)
    x128 = rng.standard_normal((128, 3, 224, 224), dtype=np.float32)
    cpu = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    name = cpu.get_inputs()[0].name
    ref = cpu.run(None, {name: x128[:32]})[0]
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    trt_cache = work / "trt-cache"
    cases = [
        ("cuda-fp32", fp32, [("CUDAExecutionProvider", {})]),
        ("cuda-fp16", fp16, [("CUDAExecutionProvider", {})]),
        (
            "tensorrt-fp16 (cold: engine build)",
            fp32,
            [
                (
                    "TensorrtExecutionProvider",
                    {
                        "trt_fp16_enable": "True",
                        "trt_engine_cache_enable": "True",
                        "trt_engine_cache_path": str(trt_cache),
                    },
                ),
                ("CUDAExecutionProvider", {}),
            ],
        ),
    ]
    cases.append(("tensorrt-fp16 (warm: cached engine)", fp32, cases[2][2]))
    for label, model, providers in cases:
        t0 = time.perf_counter()
        session = ort.InferenceSession(str(model), providers=[*providers, "CPUExecutionProvider"])
        start_s = time.perf_counter() - t0
        row: dict[str, object] = {"case": label, "session_start_s": round(start_s, 2)}
        row["providers"] = session.get_providers()
        for batch in (1, 32, 128):
            x = x128[:batch]
            binding = session.io_binding()
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
            binding.bind_output(session.get_outputs()[0].name, "cuda", 0)
            session.run_with_iobinding(binding)  # warm
            n = max(3, 256 // batch)
            times = []
            for _ in range(n):
                t = time.perf_counter()
                session.run_with_iobinding(binding)
                times.append(time.perf_counter() - t)
            out = binding.copy_outputs_to_cpu()[0]
            row[f"b{batch}_img_s"] = round(batch / float(np.median(times)), 1)
            row[f"b{batch}_p50_ms"] = round(float(np.median(times)) * 1000, 2)
            if batch >= 32:
                got = out[:32].astype(np.float32)
                got /= np.linalg.norm(got, axis=1, keepdims=True)
                row["cos_to_cpu_fp32_min"] = round(float(np.min(np.sum(got * ref, axis=1))), 6)
        print(json.dumps(row), flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
