"""Checks that need a fresh interpreter: what an import loads, what reaches stderr, a process's
peak memory, and the commands and scripts run as a user runs them."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from importlib import resources
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def test_import_has_no_side_effects() -> None:
    # Importing the package must not import onnxruntime (sessions come from initialize()).
    code = "import sys, themis_clip; print('onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_index_side_loads_no_model_libraries() -> None:
    # Vectors only: searching an index needs neither Pillow nor ONNX Runtime, and neither does
    # any name of the public index surface.
    code = (
        "import sys, themis_clip.index as index, themis_clip.index.stores.sqlite; "
        "[getattr(index, name) for name in index.__all__]; "
        "print(sorted(m for m in ('PIL', 'onnxruntime', 'tokenizers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_models_list_json_matches_the_catalogue_file(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "themis_clip.cli", "models", "list", "--json"],
        env={**os.environ, "HF_HUB_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    text = resources.files("themis_clip.models").joinpath("catalogue.json").read_text("utf-8")
    models = json.loads(text)["models"]
    assert isinstance(models, list)
    assert [{k: v for k, v in r.items() if k != "cached"} for r in rows] == models
    assert all(r["cached"] is False for r in rows)  # nothing is cached in a fresh HF cache


def test_the_docs_catalogue_table_is_generated_from_the_file() -> None:
    script = ROOT / "scripts" / "catalogue_table.py"
    out = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr


def test_corrupt_exif_warns_nobody(tmp_path: Path) -> None:
    """Pillow's warnings on a corrupt block stay off stderr (a fresh interpreter: pytest's
    own warning capture would hide the filter)."""
    exif = Image.Exif()
    exif[0x010F] = "Canon"
    exif.get_ifd(0x8769)[0x9003] = "2023:07:14 18:03:11"
    gps = exif.get_ifd(0x8825)
    gps[1], gps[2] = "N", (Fraction(33), Fraction(51), Fraction(2448, 100))
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 120, 40)).save(out, "JPEG", exif=exif)
    data = bytearray(out.getvalue())
    start = data.find(b"Exif\x00\x00")
    for i in range(start + 14, start + 200):
        data[i] = (data[i] * 7 + 13) % 256
    (tmp_path / "bad.jpg").write_bytes(bytes(data))
    code = "import sys; from themis_clip.preprocess.exif import read_exif; read_exif(sys.argv[1])"
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", code, str(tmp_path / "bad.jpg")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stderr == ""


def test_extreme_aspect_ratio_stays_small_in_memory() -> None:
    # The reference would need 224 x 22,400,000 x 3 bytes (15 GB) for these; we need a strip.
    code = (
        "import resource, numpy as np; from PIL import Image;"
        "from themis_clip import preprocess_image;"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        "rng = np.random.default_rng(0);"
        "[preprocess_image(Image.fromarray(rng.integers(0, 256, s, dtype=np.uint8)))"
        " for s in [(100000, 1, 3), (1, 100000, 3), (100000, 1)]];"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)"
    )
    grew_mb = int(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout
    )
    assert grew_mb < 200, f"{grew_mb} MB"


def test_models_list_starts_with_models_that_exist_and_marks_languages(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "themis_clip.cli", "models", "list"],
        env={**os.environ, "HF_HUB_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert out[0].startswith("start here: ")
    document = json.loads(
        resources.files("themis_clip.models").joinpath("catalogue.json").read_text()
    )
    names = {m["name"] for m in document["models"]}
    suggested = re.findall(r"([\w.-]+__[\w.-]+) \(", out[0])
    assert len(suggested) == 3 and set(suggested) <= names, suggested
    assert any(" multilingual " in line for line in out if line.startswith("  nllb-clip"))
