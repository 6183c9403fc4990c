"""Build the placeholder model shipped in ``src/themis_clip/data/demo_model``.

Random weights in CLIP's shape (224 px input, patch 32, CLIP tokenizer conventions): it makes
the embedded default runnable end to end until the trained demo model replaces it.
Run: ``.venv/bin/python scripts/build_placeholder_model.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from themis_clip.export.tiny import build_model_dir

TARGET = Path(__file__).resolve().parents[1] / "src" / "themis_clip" / "data" / "demo_model"

if __name__ == "__main__":
    shutil.rmtree(TARGET, ignore_errors=True)
    build_model_dir(
        TARGET, name="themis-placeholder-tiny", image_size=224, patch=32, width=32, dim=64, seed=42
    )
    print(f"wrote {TARGET}: {sorted(p.name for p in TARGET.iterdir())}")
