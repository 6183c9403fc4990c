#!/usr/bin/env bash
# GPU check (issue 17), about 5 minutes on one CUDA GPU: CUDA fp32 and fp16 with I/O binding,
# TensorRT with its engine cache (first build, then a warm start), batch 1/32/128, throughput and
# latency, cosine to the CPU fp32 result. Runnable as is on a CUDA machine with network access:
#   bash bench/gpu_check.sh            # results: bench/out/gpu_check.json (and printed)
# It installs onnxruntime-gpu into bench/.venv-gpu (not the project's .venv, whose CPU build
# stays); a machine without network needs onnxruntime-gpu preinstalled (GPU_PYTHON=/path/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${GPU_PYTHON:-}
if [ -z "$PY" ]; then
  if [ ! -x bench/.venv-gpu/bin/python ]; then
    python3 -m venv bench/.venv-gpu
    bench/.venv-gpu/bin/pip install --quiet onnxruntime-gpu numpy pillow tokenizers tqdm usearch \
      ftfy regex onnx
    bench/.venv-gpu/bin/pip install --quiet --no-deps -e .
  fi
  PY=bench/.venv-gpu/bin/python
fi
mkdir -p bench/out
"$PY" bench/make_models.py vit-b-32
timeout 600 "$PY" bench/gpu_check.py | tee bench/out/gpu_check.txt
