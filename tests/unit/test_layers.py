"""The layer contracts cover the whole package, with no exceptions whitelisted."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "src" / "themis_clip"


def test_every_module_is_in_a_layer_and_nothing_is_ignored() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["importlinter"]
    contracts = config["contracts"]
    assert not [c["name"] for c in contracts if c.get("ignore_imports")]
    top = next(c for c in contracts if c["type"] == "layers" and "containers" not in c)
    layered = {m.strip() for layer in top["layers"] for m in layer.split("|")}
    modules = {
        f"themis_clip.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert modules - layered == set()
