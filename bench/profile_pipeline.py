"""Where the CPU goes in files → embeddings: a py-spy profile of ``generate_embedding_batch``.

Samples every thread (decode workers and ONNX Runtime's intra-op pool, native frames included)
while the default-configured plugin embeds the pipeline benchmark's JPEG sets, then sorts the
samples into stages by the frames on each stack:

* inference: inside ``InferenceSession.run`` (ONNX Runtime's kernels and its thread pool);
* JPEG decode: Pillow's decoder (``ImageFile.load``, libjpeg-turbo);
* resize: Pillow's bicubic resample (``_resize_crop``);
* normalise: our pixel normalisation into the batch buffer (the rest of ``ImagePreprocessor``);
* file open / header: ``Image.open`` and EXIF handling;
* tokenizer (captions): Hugging Face ``tokenizers``;
* other: Python glue.

Raw collapsed stacks go to ``bench/out/profile-<set>.txt`` (flame-graph input). Needs py-spy
(``pip install py-spy``; a bench tool, not a project dependency).

Run: .venv/bin/python bench/profile_pipeline.py [--passes N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import DATA, captions, images
from make_models import ensure_exported

OUT = Path(__file__).resolve().parent / "out"

RUNNER = r"""
import glob, sys
from themis_clip import OnnxClipPlugin, PluginConfig
model, folder, passes = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = OnnxClipPlugin()
assert p.initialize(PluginConfig.from_dict({"model": {"path": model}}))
if folder.endswith(".txt"):
    lines = open(folder).read().splitlines()
    p.generate_text_embedding_batch(lines[:8])
    for _ in range(passes):
        assert all(r.ok for r in p.generate_text_embedding_batch(lines))
else:
    files = sorted(glob.glob(folder + "/*.jpg"))
    p.generate_embedding_batch(files[:4])
    for _ in range(passes):
        assert all(r.ok for r in p.generate_embedding_batch(files))
"""

# First match wins, in this order: a stack inside the session run is inference even though
# it also holds the batch loop's frames.
WAITING = (
    "PyThread_acquire_lock_timed",
    "pthread_cond_timedwait",
    "pthread_cond_wait",
    "sem_wait",
    "Condition.wait",
)
STAGES = [
    ("start-up (model load, excluded below)", ("initialize (",)),
    ("blocked (lock/queue waits; no CPU, excluded below)", WAITING),
    ("inference (ONNX Runtime)", ("InferenceSession.run", "onnxruntime", "Mlas", "libonnxruntime")),
    ("JPEG decode (libjpeg-turbo)", ("ImageFile.py", "decode (", "jpeg", "ImagingDecode")),
    ("resize (Pillow bicubic)", ("_resize_crop", "resize (PIL", "ImagingResample")),
    ("normalise into batch buffer", ("ImagePreprocessor.__call__", "__call__ (themis_clip")),
    ("open / header / EXIF", ("_open (themis", "open (PIL", "exif_transpose")),
    ("tokenizer", ("encode_batch (", "tokenizers")),
]


def classify(stack: str) -> str:
    for stage, needles in STAGES:
        if any(n in stack for n in needles):
            return stage
    return "other (Python glue, warm-up, start-up)"


def profile(model: Path, folder: Path, passes: int, name: str) -> Counter[str]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    OUT.mkdir(exist_ok=True)
    raw = OUT / f"profile-{name}.txt"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(RUNNER)
    cmd = [spy, "record", "--native", "--rate", "250", "--format", "raw", "-o", str(raw)]
    cmd += ["--", sys.executable, f.name, str(model), str(folder), str(passes)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=3600)
    finally:
        os.unlink(f.name)
    totals: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            totals[classify(stack)] += int(count)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    model = ensure_exported("hf-vit-b-32")
    sets = {
        "12mp": images(DATA / "jpeg-4000x3000-24", 24, (4000, 3000)),
        "640x480": images(DATA / "jpeg-640x480-64", 64, (640, 480)),
        "captions": captions(DATA / "captions.txt", 500),
    }
    for name, folder in sets.items():
        totals = profile(model, folder, args.passes, name)
        totals.pop(STAGES[0][0], None)
        blocked = totals.pop(STAGES[1][0], 0)
        n = sum(totals.values())
        print(
            f"\n{name}: {n} CPU samples (all threads; model load and {blocked} blocked-thread "
            "samples excluded)"
        )
        print("| stage | share of CPU samples |")
        print("|---|---:|")
        for stage, count in totals.most_common():
            print(f"| {stage} | {count / n:.1%} |")


if __name__ == "__main__":
    main()
