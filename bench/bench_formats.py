"""The cost of each photo format's decoder, per image, beside JPEG: decode + CLIP preprocessing
(224 px) of one photo-like picture at 1024x768 and 12 MP, encoded as JPEG, PNG, HEIC, AVIF,
JPEG XL and a camera RAW (DNG from sensor data, decoded by LibRaw at half size; a camera's
RAW with an embedded preview costs a JPEG decode of that preview instead).

    .venv/bin/python bench/bench_formats.py --rounds 5
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import photo_like
from tests.integration.test_photo_formats import write_dng_sized
from themis_clip.preprocess.exif import prepare_pillow
from themis_clip.preprocess.image import preprocess_image


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(next((line for line in cpu.splitlines() if line.startswith("Model name")), "cpu ?"))
    prepare_pillow()
    print("| size | format | bytes | ms per image (median) | vs JPEG |")
    print("|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for width, height in ((1024, 768), (4000, 3000)):
            picture = Image.fromarray(photo_like(width, height, 1))
            files = {}
            for fmt, options in (
                ("JPEG", {"quality": 90}),
                ("PNG", {}),
                ("HEIF", {"quality": 90}),
                ("AVIF", {"quality": 90}),
                ("JXL", {"quality": 90}),
            ):
                buf = io.BytesIO()
                picture.save(buf, format=fmt, **options)
                files[fmt] = buf.getvalue()
            dng = Path(tmp) / f"raw{width}.dng"
            write_dng_sized(dng, width, height)
            files["RAW (DNG, LibRaw)"] = dng.read_bytes()
            times = {}
            for fmt, data in files.items():
                preprocess_image(data)  # warm
                samples = []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    preprocess_image(data)
                    samples.append(time.perf_counter() - t0)
                times[fmt] = float(np.median(samples)) * 1000
            for fmt, ms in times.items():
                print(
                    f"| {width}x{height} | {fmt} | {len(files[fmt]):,} | {ms:.1f} | "
                    f"{ms / times['JPEG']:.2f} |"
                )


if __name__ == "__main__":
    main()
