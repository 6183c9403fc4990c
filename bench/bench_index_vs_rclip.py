"""Indexing wall time and library throughput against rclip 4.0.8, same ONNX graph (issue 30, item 1).

Both systems get the same random-weight ViT-B/32 export (``make_models.py hf-vit-b-32``) and the
same JPEG folders (1024x768 and 12 MP, made here). rclip reads its model from
``$RCLIP_DATADIR/ViT-B-32-256-datacomp_s34b_b86k/visual.onnx`` (it only downloads from the Hub),
so the export is linked there, and since it feeds ``{"input": pixels}`` and takes one output, the
linked graph is our visual.onnx with the input and output renamed (same nodes, same weights).
rclip's preprocessing hard-codes 256 px (its own model's input); the launcher sets it to the
export's 224 (``rclip.utils.preprocess.IMAGE_SIZE`` and ``rclip.main.IMAGE_SIZE``), nothing else.

rclip 4.0.8 declares Python >= 3.12 and numpy ~= 2.5.3; this machine has Python 3.11 only, so it
runs in ``bench/.venv-rclip`` (its own venv: numpy 2.4.6, onnxruntime 1.32.0, Pillow 13, the same
as ours) installed with ``--ignore-requires-python --no-deps``; its code compiles and runs
unchanged on 3.11. Its query is an image path, so it loads the image tower only, as ours does.

Rounds interleave the systems (ours, rclip, ours, ...), each a fresh process with a fresh index;
medians are reported with ratios ours / rclip throughput (>1: we are faster).

Usage: PYTHONPATH=src .venv/bin/python bench/bench_index_vs_rclip.py [--rounds 5] [--n 48] [--n-12mp N]
       [--skip-cli] [--skip-lib] [--baseline OTHER_SRC] [--draft]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = HERE / "models" / "hf-vit-b-32"
RCLIP_VENV = HERE / ".venv-rclip"
RCLIP_HOME = HERE / "data" / "rclip-home"
OURS_PY = Path(sys.executable)
FOLDERS = {"1024x768": (1024, 768), "12MP": (4000, 3000)}

RCLIP_LAUNCH = """
import sys
import rclip.utils.preprocess as pre
pre.IMAGE_SIZE = 224
import rclip.main as main
main.IMAGE_SIZE = 224
sys.argv = ["rclip", "--filepath-only", "--top", "1", sys.argv[1]]
main.main()
"""

RCLIP_LIB = """
import sys, time, glob
import numpy as np
import rclip.utils.preprocess as pre
pre.IMAGE_SIZE = 224
from rclip import model
from rclip.utils import helpers
paths = sorted(glob.glob(sys.argv[1] + "/*.jpg"))
m = model.Model()
m.compute_image_features([helpers.read_image(paths[0], min_side=224)])
t0 = time.perf_counter()
for i in range(0, len(paths), 8):
    imgs = [helpers.read_image(p, min_side=224) for p in paths[i:i + 8]]
    v = m.compute_image_features(imgs, for_indexing=True)
print(len(paths) / (time.perf_counter() - t0))
np.save(sys.argv[2], m.compute_image_features([helpers.read_image(paths[0], min_side=224)]))
"""

OURS_LIB = """
import sys, time, glob
import numpy as np
from themis_clip import OnnxClipPlugin, PluginConfig
paths = sorted(glob.glob(sys.argv[1] + "/*.jpg"))
p = OnnxClipPlugin()
assert p.initialize(PluginConfig.from_dict({"model": {"path": sys.argv[3]}})), p.last_error
p.generate_embedding_batch([open(paths[0], "rb").read()])
t0 = time.perf_counter()
for i in range(0, len(paths), 32):
    res = p.generate_embedding_batch([open(q, "rb").read() for q in paths[i:i + 32]])
print(len(paths) / (time.perf_counter() - t0))
np.save(sys.argv[2], np.asarray(p.generate_embedding_batch([open(paths[0], "rb").read()])[0].embedding))
"""


def photo(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (h // 64 + 2, w // 64 + 2, 3), dtype=np.uint8))
    scene = np.asarray(base.resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    texture = 25 * np.sin(xx / (3 + seed % 5)) * np.cos(yy / (4 + seed % 7))
    noise = rng.normal(0, 6, (h, w, 1)).astype(np.float32)
    return Image.fromarray(np.clip(scene + texture[..., None] + noise, 0, 255).astype(np.uint8))


def folder(name: str, n: int) -> Path:
    w, h = FOLDERS[name]
    out = HERE / "data" / f"rclip-{name}-{n}"
    out.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        path = out / f"{i:03d}.jpg"
        if not path.exists():
            photo(w, h, i).save(path, quality=85)
    return out


def rclip_model() -> None:
    """Our visual.onnx with rclip's input/output names, where rclip looks for its model."""
    import onnx

    target = RCLIP_HOME / "ViT-B-32-256-datacomp_s34b_b86k" / "visual.onnx"
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(MODEL / "visual.onnx"))
    graph = model.graph
    old_in, old_out = graph.input[0].name, graph.output[0].name
    keep = graph.output[0]
    del graph.output[:]
    graph.output.append(keep)
    for node in graph.node:
        node.input[:] = ["input" if x == old_in else x for x in node.input]
        node.output[:] = ["output" if x == old_out else x for x in node.output]
    graph.input[0].name, graph.output[0].name = "input", "output"
    onnx.save(model, str(target))
    for name in ("LICENSE", "OPENAI-CLIP-MIT.txt", "README.md", "THIRD_PARTY_NOTICES.md"):
        (RCLIP_HOME / name).write_text("benchmark stand-in: random weights\n")
    # ensure_downloaded() wants the text tower too (unused: the query is an image path)
    (target.parent / "textual.onnx").symlink_to(MODEL / "textual.onnx")
    (RCLIP_HOME / "tokenizer").mkdir(exist_ok=True)
    (RCLIP_HOME / "tokenizer" / "bpe_simple_vocab_16e6.txt.gz").write_bytes(b"")


FLOOR = """
import sys
import numpy as np
import onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
name = s.get_inputs()[0].name
pixels = np.random.default_rng(0).standard_normal((int(sys.argv[2]), 3, 224, 224), np.float32)
for i in range(0, len(pixels), 32):
    s.run(None, {name: pixels[i : i + 32]})
"""


def run_floor(images: Path) -> float:
    """The least any system running this graph can take: a fresh process that imports ONNX
    Runtime, opens the image tower and runs it on as many ready-made inputs (no decoding, no
    files, no database)."""
    n = len(list(images.glob("*.jpg")))
    t0 = time.perf_counter()
    subprocess.run(
        [str(OURS_PY), "-c", FLOOR, str(MODEL / "visual.onnx"), str(n)],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def run_ours_cli(
    images: Path,
    src: Path = ROOT / "src",
    decode_mode: str | None = None,
    cache: Path | None = None,
) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(src)}
        cmd = [str(OURS_PY), "-m", "themis_clip.cli", "index", str(images), "--model", str(MODEL)]
        config: dict[str, object] = {}
        if decode_mode is not None:
            config["preprocess"] = {"decode_mode": decode_mode}
        if cache is not None:
            config["session"] = {"optimized_model_cache_dir": str(cache)}
        if config:
            (Path(tmp) / "config.json").write_text(
                json.dumps({"model": {"path": str(MODEL)}, **config})
            )
            cmd += ["--config", f"{tmp}/config.json"]
        t0 = time.perf_counter()
        subprocess.run([*cmd, "--index", f"{tmp}/i.db"], env=env, check=True, capture_output=True)
        return time.perf_counter() - t0


def run_rclip_cli(images: Path) -> float:
    for db in RCLIP_HOME.glob("db.sqlite3*"):
        db.unlink()
    env = {**os.environ, "RCLIP_DATADIR": str(RCLIP_HOME), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    subprocess.run(
        [str(RCLIP_VENV / "bin" / "python"), "-c", RCLIP_LAUNCH, str(images / "000.jpg")],
        cwd=images,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def run_lib(ours: bool, images: Path, out: Path) -> float:
    if ours:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        argv = [str(OURS_PY), "-c", OURS_LIB, str(images), str(out), str(MODEL)]
    else:
        env = {**os.environ, "RCLIP_DATADIR": str(RCLIP_HOME), "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        argv = [str(RCLIP_VENV / "bin" / "python"), "-c", RCLIP_LIB, str(images), str(out)]
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def draft_cosines(images: Path) -> str:
    """Cosines of each image's vector under 'draft' (and 'fast', the default) to 'exact'."""
    from themis_clip import OnnxClipPlugin, PluginConfig

    paths = sorted(images.glob("*.jpg"))
    vectors = {}
    for mode in ("exact", "fast", "draft"):
        plugin = OnnxClipPlugin(lazy_textual=True)
        config = {"model": {"path": str(MODEL)}, "preprocess": {"decode_mode": mode}}
        assert plugin.initialize(PluginConfig.from_dict(config)), plugin.last_error
        results = plugin.generate_embedding_batch(paths)
        plugin.shutdown()
        vectors[mode] = np.stack([np.asarray(r.embedding) for r in results])
    parts = []
    for a, b in (("draft", "exact"), ("fast", "exact"), ("draft", "fast")):
        cos = np.sum(vectors[a] * vectors[b], axis=1)  # unit vectors
        parts.append(f"{a}~{b} min {cos.min():.6f} median {np.median(cos):.6f}")
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=48, help="images per folder")
    ap.add_argument("--n-12mp", type=int, help="images in the 12 MP folder (default: --n)")
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--skip-lib", action="store_true")
    ap.add_argument(
        "--draft",
        action="store_true",
        help="also time ours with the opt-in preprocess.decode_mode 'draft', and its cosines",
    )
    ap.add_argument(
        "--cached",
        action="store_true",
        help="also time ours with session.optimized_model_cache_dir (warm after round one)",
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        help="another source tree of ours (e.g. `git archive main src | tar -x -C /tmp/base`), "
        "timed in the same interleaved rounds as 'base'",
    )
    args = ap.parse_args()
    print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Flags")[0])
    rclip_model()
    shutil.rmtree(RCLIP_HOME / "cache", ignore_errors=True)
    # Installed packages run from bytecode (pip compiles rclip's and every dependency's at
    # install time); our source tree may have none (PYTHONDONTWRITEBYTECODE), and compiling ~120
    # modules in every fresh process would cost ours 0.1-0.2 s that an installed wheel never pays.
    for src in (ROOT / "src", *([args.baseline] if args.baseline else [])):
        subprocess.run([str(OURS_PY), "-m", "compileall", "-q", str(src)], check=True)
    counts = {"1024x768": args.n, "12MP": args.n_12mp or args.n}
    sets = {name: folder(name, counts[name]) for name in FOLDERS}
    if not args.skip_cli:
        walls: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for name, images in sets.items():
                systems: tuple[tuple[str, Callable[[Path], float]], ...] = (
                    ("ours", run_ours_cli),
                    ("rclip", run_rclip_cli),
                    ("floor", run_floor),
                )
                if args.baseline:
                    systems += (("base", functools.partial(run_ours_cli, src=args.baseline)),)
                if args.draft:
                    systems += (("draft", functools.partial(run_ours_cli, decode_mode="draft")),)
                if args.cached:
                    cache = HERE / "data" / "start-up-cache"
                    systems += (("cached", functools.partial(run_ours_cli, cache=cache)),)
                for system, fn in systems:
                    if r == 0:
                        fn(images)  # page cache warm for both
                    walls.setdefault((name, system), []).append(fn(images))
        print(f"index wall time, fresh process, {counts} images, median of {args.rounds}:")
        for name in sets:
            o = statistics.median(walls[(name, "ours")])
            c = statistics.median(walls[(name, "rclip")])
            f = statistics.median(walls[(name, "floor")])
            print(
                f"  {name:9s} ours {o:6.2f} s  rclip {c:6.2f} s  ratio (ours/rclip thr) {c / o:.2f}"
                f"  | floor {f:5.2f} s: the best ratio any system on this graph can reach "
                f"{c / f:.2f}"
            )
            if args.baseline:
                b = statistics.median(walls[(name, "base")])
                print(f"  {'':9s} baseline {b:6.2f} s: ratio (base/rclip thr) {c / b:.2f}")
            if args.cached:
                k = statistics.median(walls[(name, "cached")])
                print(f"  {'':9s} start-up cache {k:6.2f} s: ratio (cached/rclip thr) {c / k:.2f}")
            if args.draft:
                d = statistics.median(walls[(name, "draft")])
                print(
                    f"  {'':9s} decode_mode draft {d:6.2f} s: ratio (draft/rclip thr) {c / d:.2f}"
                )
    if args.draft:
        for name, images in sets.items():
            print(f"  {name:9s} cosine per image, {draft_cosines(images)}")
    if not args.skip_lib:
        with tempfile.TemporaryDirectory() as tmp:
            rates: dict[tuple[str, bool], list[float]] = {}
            for _ in range(args.rounds):
                for name, images in sets.items():
                    for ours in (True, False):
                        out = Path(tmp) / f"{name}-{ours}.npy"
                        rates.setdefault((name, ours), []).append(run_lib(ours, images, out))
            print(f"library throughput (images/s after load), median of {args.rounds}:")
            for name in sets:
                o = statistics.median(rates[(name, True)])
                c = statistics.median(rates[(name, False)])
                a = np.load(Path(tmp) / f"{name}-True.npy").ravel()
                b = np.load(Path(tmp) / f"{name}-False.npy").ravel()
                cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
                print(
                    f"  {name:9s} ours {o:6.1f}/s  rclip {c:6.1f}/s  ratio {o / c:.2f}"
                    f"  (cosine of image 0: {cos:.7f})"
                )


if __name__ == "__main__":
    main()
