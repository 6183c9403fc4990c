"""Memory of loading a ViT-B/32 image tower: memory-mapped vs traditional (bytes) vs path.

For each mode, 4 processes load the same model and run one inference; the harness reports the
peak RSS of loading (VmHWM right after the session exists, minus the process's RSS before the
load) and the total PSS of the 4 processes while they all hold the model. Modes:

* ``bytes``: the seed's traditional load: the file read into the heap, session from bytes.
* ``path``:  ONNX Runtime reads the file itself (this project's default).
* ``mmap``:  ``model.enable_mmap_loading``: weights served from the page-aligned cached copy.

Run: .venv/bin/python bench/bench_memory.py [--processes 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_models import ensure

WORKER = r"""
import json, sys, numpy as np
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key): return int(line.split()[1]) / 1024
mode, path = sys.argv[1], sys.argv[2]
import onnxruntime as ort
from themis_clip import OnnxClipPlugin, PluginConfig
before = status('VmRSS:')
if mode == 'bytes':
    data = open(path, 'rb').read()
    session = ort.InferenceSession(data, providers=['CPUExecutionProvider']); del data
    run = lambda x: session.run(None, {'pixel_values': x})
else:
    plugin = OnnxClipPlugin()
    config = PluginConfig.from_dict({'model': {'path': path, 'enable_mmap_loading': mode == 'mmap'}})
    assert plugin.initialize(config), plugin.last_error
    assert plugin.get_statistics()['loading_mode'] == mode, plugin.get_statistics()['loading_note']
    run = plugin.embed_pixels
peak_load = status('VmHWM:')
run(np.zeros((1, 3, 224, 224), np.float32))
print(json.dumps({'before': before, 'peak_load': peak_load, 'rss': status('VmRSS:')}), flush=True)
sys.stdin.readline()
"""


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no Pss line")


def measure(mode: str, model: Path, processes: int) -> dict[str, float]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, mode, str(model)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    reports = []
    try:
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if not line:
                raise RuntimeError(f"{mode} worker failed")
            reports.append(json.loads(line))
        time.sleep(0.5)
        total_pss = sum(pss_mib(p.pid) for p in procs)
    finally:
        for p in procs:
            if p.stdin:
                p.stdin.write("\n")
                p.stdin.flush()
            p.wait(60)
    loads = [r["peak_load"] - r["before"] for r in reports]
    return {
        "load_peak_mib": max(loads),
        "load_peak_abs_mib": max(r["peak_load"] for r in reports),
        "total_pss_mib": total_pss,
    }


SPEED = r"""
import sys, time, numpy as np
from themis_clip import OnnxClipPlugin, PluginConfig
plugin = OnnxClipPlugin()
assert plugin.initialize(PluginConfig.from_dict({'model': {'path': sys.argv[2], 'enable_mmap_loading': sys.argv[1] == 'mmap'}}))
x = np.random.default_rng(0).random((8, 3, 224, 224), dtype=np.float32)
run = plugin.embed_pixels
run(x)
t = time.perf_counter()
for _ in range(4):
    run(x)
print(32 / (time.perf_counter() - t))
"""


def speed(mode: str, model: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-c", SPEED, mode, str(model)], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    model = ensure("vit-b-32")
    # Warm the mmap cache (one-time conversion) so it is not counted as a load.
    measure("mmap", model, 1)
    size_mib = model.stat().st_size / 2**20
    rows = {mode: measure(mode, model, args.processes) for mode in ("bytes", "path", "mmap")}
    print(f"model file: {size_mib:.0f} MiB ({model.name}, ViT-B/32 architecture, random weights)")
    print(
        f"{'mode':6} {'load peak MiB':>14} {'x file':>7} {'abs peak MiB':>13} {f'{args.processes}-proc PSS MiB':>17} {'vs bytes':>9}"
    )
    for mode, r in rows.items():
        print(
            f"{mode:6} {r['load_peak_mib']:14.0f} {r['load_peak_mib'] / size_mib:7.2f} {r['load_peak_abs_mib']:13.0f} "
            f"{r['total_pss_mib']:17.0f} {r['total_pss_mib'] / rows['bytes']['total_pss_mib']:9.2f}"
        )
    rounds: dict[str, list[float]] = {"path": [], "mmap": []}
    for _ in range(3):  # interleaved rounds, separate processes
        for mode in rounds:
            rounds[mode].append(speed(mode, model))
    med = {m: sorted(v)[1] for m, v in rounds.items()}
    print(
        f"throughput, batch 8 (median of 3 interleaved runs): path {med['path']:.1f} img/s, "
        f"mmap {med['mmap']:.1f} img/s, ratio {med['mmap'] / med['path']:.2f}"
    )
    print(json.dumps({"file_mib": size_mib, **rows, "speed_img_s": med}))


if __name__ == "__main__":
    main()
