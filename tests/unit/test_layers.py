"""The layer contracts cover the whole package, with no exceptions whitelisted."""

from __future__ import annotations

import ast
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


# Libraries with exactly one home module: a second importer would fork their policy
# (lock timeouts, connection set-up, decoder budgets).
SINGLE_HOMES = {
    "filelock": "themis_clip.files",
    "psycopg": "themis_clip.index.stores.postgres.store",
    "rawpy": "themis_clip.preprocess.raw",
    "usearch": "themis_clip.index.ann",
    "ftfy": "themis_clip.preprocess.text",
    "python_multipart": "themis_clip.server.bodies",
}


def _importers(library: str) -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(n.split(".")[0] == library for n in names):
                found.add(module.removesuffix(".__init__"))
    return found


def test_single_home_libraries_are_imported_only_by_their_home() -> None:
    for library, home in SINGLE_HOMES.items():
        assert _importers(library) == {home}, library
