"""Session tuning and the decode/inference thread split, measured side by side.

Part 1, session knobs (exported random ViT-B/32, both towers), each configuration in its own
process: ``initialize`` time (both towers, warm page cache), image-tower throughput on
pre-made batches of 32, text-tower throughput on 32 captions of 24 tokens, and peak RSS:

* ``optimization_level`` all / extended / basic / disabled;
* the optimised-model cache, cold (written during this load) and warm (loaded from it);
* CPU memory arena off; intra-op spinning off; one intra-op thread;
* the int8 and fp16 variants (fp16 is meant for GPUs; measured here on CPU).

Part 2, files → embeddings (``generate_embedding_batch``, decode_mode fast) on the 12 MP and
640×480 JPEG sets of the pipeline benchmark, over intra-op threads {1, 2} × decode workers
{1, 2} × spinning {on, off}: how to share 2 cores between decoding and ONNX Runtime; and how
many batches to decode ahead of the session (``prefetch_batches`` 0, 1 = default, 2, 4).

Interleaved rounds, medians. Run: .venv/bin/python bench/bench_session.py [--rounds N] [--only TEXT]
[--full]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import DATA, images
from make_models import ensure_exported

ENGINE = r"""
import json, resource, sys, time, glob
import numpy as np
from themis_clip import OnnxClipPlugin, PluginConfig
mode, model, cfg, sets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
p = OnnxClipPlugin()
t = time.perf_counter()
variant = cfg.pop("variant", None)
assert p.initialize(PluginConfig.from_dict({"model": {"path": model, "variant": variant}, "max_batch_size": 32, **cfg}))
out = {"init_s": time.perf_counter() - t, "cache": p.get_statistics()["optimized_model_cache"]}
if mode == "knobs":
    x = np.random.default_rng(0).standard_normal((32, 3, 224, 224), dtype=np.float32)
    p.embed_pixels(x)
    t = time.perf_counter()
    for _ in range(2): p.embed_pixels(x)
    out["image_per_s"] = 64 / (time.perf_counter() - t)
    sot, eot = p.tokenize([""])[0]
    rows = [[sot] + [400 + i] * 22 + [eot] for i in range(32)]
    p.embed_tokens(rows)
    t = time.perf_counter()
    for _ in range(3): p.embed_tokens(rows)
    out["text_per_s"] = 96 / (time.perf_counter() - t)
else:
    for name, folder in sets.items():
        files = sorted(glob.glob(folder + "/*.jpg"))
        p.generate_embedding_batch(files[:8])
        t = time.perf_counter()
        assert all(r.ok for r in p.generate_embedding_batch(files))
        out[name] = len(files) / (time.perf_counter() - t)
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def run(mode: str, model: Path, cfg: dict[str, Any], sets: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", ENGINE, mode, str(model), json.dumps(cfg), json.dumps(sets)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", help="run only the configurations whose name contains this")
    parser.add_argument("--full", action="store_true", help="200 + 200 images instead of 24 + 64")
    args = parser.parse_args()
    model = ensure_exported("hf-vit-b-32")
    n12, n640 = (200, 200) if args.full else (24, 64)
    sets = {
        "12 MP": str(images(DATA / f"jpeg-4000x3000-{n12}", n12, (4000, 3000))),
        "640x480": str(images(DATA / f"jpeg-640x480-{n640}", n640, (640, 480))),
    }
    warm_cache = tempfile.mkdtemp(prefix="themis-ort-cache-")
    run("knobs", model, {"session": {"optimized_model_cache_dir": warm_cache}}, {})
    knobs: dict[str, dict[str, Any]] = {
        "default (all, arena, spin)": {},
        "level extended": {"session": {"optimization_level": "extended"}},
        "level basic": {"session": {"optimization_level": "basic"}},
        "level disabled": {"session": {"optimization_level": "disabled"}},
        "cache cold (writes)": {"session": {"optimized_model_cache_dir": None}},
        "cache warm (hit)": {"session": {"optimized_model_cache_dir": warm_cache}},
        "arena off": {"session": {"cpu_mem_arena": False}},
        "spinning off": {"session": {"allow_spinning": False}},
        "intra-op threads 1": {"intra_op_threads": 1},
        "variant int8": {"variant": "int8"},
        "variant fp16 (on CPU)": {"variant": "fp16"},
    }
    split: dict[str, dict[str, Any]] = {
        f"intra {t}, workers {w}, spin {'on' if s else 'off'}": {
            "intra_op_threads": t,
            "preprocess_workers": w,
            "session": {"allow_spinning": s},
        }
        for t in (2, 1)
        for w in (2, 1)
        for s in (True, False)
    }
    # Batches of 8, so the 24 / 64 files make 3 / 8 batches to decode ahead (default depth 1).
    prefetch = {
        f"prefetch {depth} batches of 8": {"max_batch_size": 8, "prefetch_batches": depth}
        for depth in (1, 0, 2, 4)
    }
    if args.only:
        knobs = {k: v for k, v in knobs.items() if args.only in k or k.startswith("default")}
        split = {k: v for k, v in split.items() if args.only in k or k == next(iter(split))}
        if args.only not in "prefetch":
            prefetch = {}
    got: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for name, cfg in knobs.items():
            if name.startswith("cache cold"):
                with tempfile.TemporaryDirectory() as cold:
                    cfg = {"session": {"optimized_model_cache_dir": cold}}
                    got.setdefault(name, []).append(run("knobs", model, cfg, {}))
                continue
            got.setdefault(name, []).append(run("knobs", model, cfg, {}))
        for name, cfg in {**split, **prefetch}.items():
            got.setdefault(name, []).append(run("e2e", model, cfg, sets))

    shutil.rmtree(warm_cache, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return float(np.median([r[key] for r in got[name]]))

    base = "default (all, arena, spin)"
    print(
        "| configuration | initialize s | image/s (b32) | × default | text/s (b32, 24 tok) | × default | peak RSS MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in knobs:
        print(
            f"| {name} | {med(name, 'init_s'):.2f} | {med(name, 'image_per_s'):.1f} | "
            f"{med(name, 'image_per_s') / med(base, 'image_per_s'):.2f} | "
            f"{med(name, 'text_per_s'):.0f} | {med(name, 'text_per_s') / med(base, 'text_per_s'):.2f} | "
            f"{med(name, 'peak_rss_mib'):.0f} |"
        )
    for title, group in (("threads split", split), ("decode ahead", prefetch)):
        if not group:
            continue
        first = next(iter(group))
        print()
        print(f"| {title} | 12 MP img/s | × first row | 640×480 img/s | × first row |")
        print("|---|---:|---:|---:|---:|")
        for name in group:
            print(
                f"| {name} | {med(name, '12 MP'):.1f} | "
                f"{med(name, '12 MP') / med(first, '12 MP'):.2f} | {med(name, '640x480'):.1f} | "
                f"{med(name, '640x480') / med(first, '640x480'):.2f} |"
            )
    print(json.dumps({k: v for k, v in got.items()}, default=str)[:4000])


if __name__ == "__main__":
    main()
