"""Files shipped inside the package."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["demo_model_path"]


def demo_model_path() -> Path:
    """The model directory shipped with the package (the embedded default model)."""
    return Path(str(files("themis_clip") / "data" / "demo_model"))
