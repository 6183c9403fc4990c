"""Every command, with the optional extras unimportable: a message and an exit code, never a
traceback (issue 26 item 7). The extras' modules are blocked by an import hook in the child
process, not uninstalled, so the rest of the environment is the real one."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from themis_clip.cli import _parser

#: what the export, ray and postgres extras bring (the server's are blocked for ``serve``)
BLOCKED = ("torch", "onnx", "onnxscript", "transformers", "ray", "pyarrow", "psycopg", "pgvector")
SERVER = ("fastapi", "hypercorn", "starlette", "prometheus_client")

SHIM = """
import importlib.abc, sys
BLOCK = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
from themis_clip.cli import main
sys.exit(main(sys.argv[2:]))
"""

PG = "postgresql://user@127.0.0.1:1/db"


def run(args: list[str], blocked: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SHIM, ",".join(blocked), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def commands() -> list[str]:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("noextras")
    (root / "photos").mkdir()
    Image.new("RGB", (32, 24), (200, 30, 30)).save(root / "photos" / "red.png")
    (root / "model").mkdir()
    (root / "model" / "manifest.json").write_text('{"embedding_dim": 64}')
    (root / "ref").mkdir()
    (root / "ref" / "config.json").write_text('{"projection_dim": 64}')
    return root


# command → (arguments, the extra its message must name, or None: it must just work or fail
# cleanly). A command missing here runs with no arguments (argparse's usage error).
CASES: dict[str, tuple[list[str], str | None]] = {
    "embed": (["--text", "a red circle"], None),
    "info": ([], None),
    "health": ([], None),
    "classify": (["photos/red.png", "--labels", "red,blue"], None),
    "index": (["photos", "--index", PG], "postgres"),
    "search": (["a red circle", "--index", PG], "postgres"),
    "embed-dataset": (["photos", "out"], "ray"),
    "serve": (["--port", "0"], "server"),
    "export": (["ref", "exported"], "export"),
    "verify": (["model", "--reference", "ref"], "export"),
    "demo": (["--count", "4", "--gallery", "gallery/g"], None),
    "keys": (["list", "--keys", "keys.json"], None),
    "duplicates": (["--index", PG], "postgres"),
    "migrate": (["--index", "photos.db", "--to", "model"], None),
    "models": (["list"], None),
}


@pytest.mark.parametrize("command", commands())
def test_no_traceback_without_extras(command: str, work: Path) -> None:
    args, extra = CASES.get(command, ([], None))
    blocked = BLOCKED + SERVER if command == "serve" else BLOCKED
    r = run([command, *args], blocked, work)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode in (0, 1, 2), r.stderr
    if extra is not None:
        assert r.returncode == 2, r.stderr
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert lines == [
            f"themis-clip: error: {command} needs the {extra} extra (" + lines[0].split("(", 1)[1]
        ], r.stderr  # one line, nothing before it
        assert f"pip install 'themis-onnx-clip[{extra}]'" in lines[0]


def test_every_command_has_a_case() -> None:
    assert set(CASES) == set(commands())  # a new command gets its case here
