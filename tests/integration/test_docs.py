"""The README's and the docs' examples, run as a user would run them.

- every ```python block in README.md and docs/*.md runs in a folder holding the images it names;
- every ``themis-clip`` line in a ```bash block names a command and options that exist, and the
  README's and the command-line page's lines that need nothing but the demo model run for real;
- every ```bash block with ``curl`` in README.md and docs/http-api.md runs against a real
  ``themis-clip serve`` (``localhost:8080`` replaced by its address), each ``curl`` failing on an
  HTTP error;
- the configuration page's JSON parses as a ``PluginConfig``.

A block the tests cannot run here is preceded by ``<!-- not run: reason -->``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import ServerProcess
from themis_clip import PluginConfig, demo_model_path
from themis_clip.cli import main
from themis_clip.demo.scenes import write_gallery

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
BIN = Path(sys.executable).parent
ADMIN_TOKEN = "docs-example-token"


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path, lang: str) -> list[Block]:
    """The fenced blocks of ``lang`` in ``path`` that are not marked ``<!-- not run: ... -->``."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)\s*", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marked = i > 0 and lines[i - 1].lstrip().startswith("<!-- not run:")
        if fence.group(1) == lang and not marked:
            found.append(Block(path, i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return found


def all_blocks(lang: str, paths: list[Path]) -> list[Block]:
    return [b for p in paths for b in blocks(p, lang)]


def commands(text: str) -> list[str]:
    """Shell lines with their ``\\`` continuations joined."""
    return [c.strip() for c in re.sub(r"\\\n\s*", " ", text).splitlines() if c.strip()]


def write_images(folder: Path) -> None:
    """``photos/`` (two sub-folders of demo scenes) and the single files the examples name."""
    write_gallery(folder / "photos" / "holidays", 6)
    write_gallery(folder / "photos" / "work", 6)
    first = sorted((folder / "photos" / "holidays").glob("*.jpg"))[0]
    for name in ("photo.jpg", "query.jpg", "a.jpg", "b.jpg"):
        shutil.copyfile(first, folder / name)
    Image.open(first).save(folder / "b.png")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("docs")
    write_images(folder)
    return folder


def run_shell(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **env},
    )


def test_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links no docs"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


@pytest.mark.parametrize("block", all_blocks("python", [README, *DOCS]), ids=lambda b: b.id)
def test_python_blocks_run(block: Block, tmp_path: Path) -> None:
    write_images(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", block.text],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{block.id}:\n{done.stdout}\n{done.stderr}"


# ---------------------------------------------------------------- the command line


def cli_lines(paths: list[Path]) -> Iterator[tuple[Block, str]]:
    for block in all_blocks("bash", paths):
        for line in commands(block.text):
            if line.startswith("themis-clip "):
                yield block, line


def invocations(line: str) -> list[tuple[str, list[str]]]:
    """(sub-command, options) for each sub-command a cheat-sheet line names (``info | health``,
    ``models list | pull NAME``: a group's sub-command is part of the name)."""
    words = shlex.split(line.replace("[", " ").replace("]", " "), comments=True)[1:]
    if ">" in words:
        words = words[: words.index(">")]
    group = words[0] if words[0] in GROUPS else None
    if group is not None:
        words.pop(0)
    names = [words.pop(0)]
    while len(words) >= 2 and words[0] == "|":
        words.pop(0)
        names.append(words.pop(0))
        while group is not None and words and not words[0].startswith("-") and words[0] != "|":
            words.pop(0)  # the sub-command's positional argument (NAME)
    options = [w.split("=", 1)[0] for w in words if w.startswith("--")]
    return [(f"{group} {name}" if group else name, options) for name in names]


GROUPS = ("keys", "models")  # commands whose first argument is a sub-command


_help: dict[str, str] = {}


def help_of(command: str) -> str:
    if command not in _help:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
            main([*command.split(), "--help"])
        assert exited.value.code == 0, f"`themis-clip {command}` does not exist"
        _help[command] = out.getvalue()
    return _help[command]


def test_cli_lines_name_real_commands_and_options() -> None:
    seen = 0
    for block, line in cli_lines([README, *DOCS]):
        for command, options in invocations(line):
            text = help_of(command)
            for option in options:
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), (
                    f"{block.id}: `themis-clip {command}` has no option {option}: {line}"
                )
            seen += 1
    assert seen >= 20


NOT_HERE = ("postgresql", "export", "verify", "serve", "./models", "embed-dataset", "--language")


def runnable(line: str) -> bool:
    return not any(w in line for w in NOT_HERE) and not re.search(r"[\[|]|--filter", line)


@pytest.mark.slow
@pytest.mark.parametrize("path", [README, ROOT / "docs" / "cli.md"], ids=lambda p: p.name)
def test_cli_lines_run(path: Path, tmp_path: Path) -> None:
    write_images(tmp_path)
    lines = [line for _, line in cli_lines([path]) if runnable(line)]
    assert len(lines) >= 5, lines
    for line in lines:
        before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
        done = run_shell(line, tmp_path)
        assert done.returncode == 0, f"{path.name}: {line}\n{done.stdout}\n{done.stderr}"
        after = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
        assert done.stdout.strip() or after != before, f"{line}: no output"


def folder_filter_lines() -> list[str]:
    return [line for _, line in cli_lines([README, ROOT / "docs" / "cli.md"]) if "--filter" in line]


def test_folder_filter_example_works_on_a_folder_index(tmp_path: Path) -> None:
    write_images(tmp_path)
    lines = folder_filter_lines()
    assert lines
    built = run_shell("themis-clip index photos/ --index photos.db", tmp_path)
    assert built.returncode == 0, built.stderr
    for line in lines:
        done = run_shell(line + " --json", tmp_path)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        assert "photos/holidays/" in done.stdout, done.stdout
        assert "photos/work/" not in done.stdout, done.stdout


# ---------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[ServerProcess]:
    built = run_shell("themis-clip index photos/ --index photos.db", workdir)
    assert built.returncode == 0, built.stderr
    models = workdir / "models"
    shutil.copytree(demo_model_path(), models / "vit-b-32")
    args = ["--index", str(workdir / "photos.db"), "--model-root", str(models)]
    with ServerProcess(args, env={"THEMIS_ADMIN_TOKEN": ADMIN_TOKEN}) as proc:
        yield proc


# Every example's curl fails on an HTTP error and is counted, so none is skipped unseen.
CURL = """set -euo pipefail
curl() { echo x >> "$CURL_COUNT"; command curl -sS --fail-with-body --max-time 120 "$@"; }
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "block",
    [b for b in all_blocks("bash", [README, ROOT / "docs" / "http-api.md"]) if "curl " in b.text],
    ids=lambda b: b.id,
)
def test_curl_examples_run(block: Block, server: ServerProcess, workdir: Path) -> None:
    address = server.base.removeprefix("http://")
    script = CURL + block.text.replace("localhost:8080", address)
    count = workdir / f"curl-count-{block.line}"
    count.unlink(missing_ok=True)
    done = run_shell(script, workdir, CURL_COUNT=str(count), THEMIS_ADMIN_TOKEN=ADMIN_TOKEN)
    assert done.returncode == 0, f"{block.id}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    expected = len(re.findall(r"^\s*curl ", block.text, flags=re.MULTILINE))
    assert len(count.read_text().splitlines()) == expected


def test_readme_has_curl_for_the_main_endpoints() -> None:
    text = "".join(b.text for b in all_blocks("bash", [README]))
    for endpoint in ("/search", "/embed/text", "/embed/image", "/v1/embeddings", "/rank"):
        assert f"localhost:8080{endpoint}" in text, endpoint


# ---------------------------------------------------------------- configuration


def test_configuration_example_parses() -> None:
    (block,) = blocks(ROOT / "docs" / "configuration.md", "json")
    text = block.text.replace('"…64 hex digits…"', '"' + "0" * 64 + '"')
    config = PluginConfig.from_json(text)
    assert config.model.embedding_dim == 768
    assert config.search is not None and config.search.index == "photos.db"


# ---------------------------------------------------------------- the README's screenshot


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("chromium") is None and not os.environ.get("CI"),
    reason="chromium not installed (CI installs it)",
)
def test_screenshot_script_shows_the_demo_gallery(tmp_path: Path) -> None:
    out = tmp_path / "shot.png"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "screenshot.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    with Image.open(out) as shot:
        assert shot.size == (1280, 860)
        pixels = np.asarray(shot.convert("RGB")).reshape(-1, 3)
    # Not a blank page: the thumbnails of coloured scenes make many distinct colours.
    assert len(np.unique(pixels, axis=0)) > 100
    assert (ROOT / "docs" / "search-page.png").is_file()


# ---------------------------------------------------------------- the site


@pytest.mark.slow
def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link or anchor, a missing include or an API reference
    that no longer resolves fails (CI runs the same command in ``.ci/run``)."""
    pytest.importorskip("mkdocs")
    done = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def test_the_set_up_installs_what_the_readmes_next_commands_need() -> None:
    # The README sends a new user from `bash scripts/demo.sh` to `themis-clip serve`: demo.sh
    # installed only the photos extra, and serve said hypercorn was missing.
    readme = (ROOT / "README.md").read_text("utf-8")
    demo = (ROOT / "scripts" / "demo.sh").read_text("utf-8")
    extras = set(re.search(r'EXTRAS="\[([^\]]*)\]"', demo)[1].split(","))  # type: ignore[index]
    assert "themis-clip serve --index .cache/demo-index.db" in readme
    assert {"server", "photos"} <= extras
