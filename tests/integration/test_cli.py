"""The CLI as users run it: a subprocess of the installed ``themis-clip`` entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import photo_like
from themis_clip.runtime import available_providers

EXE = shutil.which("themis-clip") or str(Path(sys.executable).parent / "themis-clip")


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def images(tmp_path: Path) -> Path:
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    Image.fromarray(photo_like(80, 60, 1)).save(folder / "a.jpg")
    Image.fromarray(photo_like(60, 80, 2)).save(folder / "sub" / "b.png")
    (folder / "notes.txt").write_text("not an image")
    return folder


def test_embed_json_lines(images: Path, tiny_model_dir: Path) -> None:
    out = run("embed", str(images), "--model", str(tiny_model_dir), "--text", "a red circle")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [Path(r["path"]).name for r in rows[:2]] == [
        "a.jpg",
        "b.png",
    ]  # folder walked, .txt skipped
    assert rows[2]["text"] == "a red circle" and rows[2]["truncated"] is False
    for r in rows:
        assert r["ok"] and len(r["embedding"]) == 32
        assert abs(np.linalg.norm(r["embedding"]) - 1) < 1e-5
        assert r["model_id"].startswith("tiny-a@")


def test_embed_npy_and_failures(images: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8 broken")
    target = tmp_path / "out.npy"
    out = run(
        "embed",
        str(images / "a.jpg"),
        str(bad),
        "--model",
        str(tiny_model_dir),
        "-o",
        str(target),
        "--batch-size",
        "1",
    )
    assert out.returncode == 1  # some inputs failed, the rest were still written
    assert "bad.jpg" in out.stderr
    matrix = np.load(target)
    assert matrix.shape == (2, 32) and np.isfinite(matrix[0]).all() and np.isnan(matrix[1]).all()
    index = json.loads(target.with_suffix(".json").read_text())
    assert [i["ok"] for i in index] == [True, False]


def test_info_and_health(tiny_model_dir: Path) -> None:
    info = run("info", "--model", str(tiny_model_dir))
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert data["plugin"]["name"] == "onnx_clip" and data["model"]["embedding_dim"] == 32
    assert data["backend"] == "cpu"
    assert data["precision"] == "f32"  # the reference: no canary to run
    assert data["canary"] == {"floor": 0.9999, "min_cosine": {}, "refused": []}
    health = run("health", "--model", str(tiny_model_dir), "--openvino-precision", "f32")
    assert health.returncode == 0 and json.loads(health.stdout)["healthy"] is True
    assert json.loads(health.stdout)["precision"] == "f32"
    assert json.loads(health.stdout)["precision_variant"] == data["model"]["precision_variant"]
    ignored = run(
        "info", "--model", str(tiny_model_dir), "--backend", "cpu", "--openvino-precision", "bf16"
    )
    assert ignored.returncode != 0 and "openvino.precision" in ignored.stderr
    assert "the cpu backend does not use" in ignored.stderr
    refused = run("info", "--model", str(tiny_model_dir), "--backend", "openvino")
    if "OpenVINOExecutionProvider" not in available_providers():  # no OpenVINO: a clear error
        assert refused.returncode != 0
        assert "backend 'openvino' needs OpenVINOExecutionProvider" in refused.stderr
        assert "themis-onnx-clip[openvino]" in refused.stderr
    else:  # OpenVINO's runtime on this CPU, whatever its vendor
        assert refused.returncode == 0, refused.stderr
        assert json.loads(refused.stdout)["backend"] == "openvino"


def test_commands_keep_start_up_work_in_the_user_cache(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A command keeps its optimised graphs (and OpenVINO's, and the canary's references) in
    $XDG_CACHE_HOME/themis-clip/sessions unless its config names a folder, or null for none."""
    home = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    sessions = tmp_path / "xdg" / "themis-clip" / "sessions"
    assert run("info", "--model", str(tiny_model_dir), env=home).returncode == 0
    entries = {p.parent for p in sessions.glob("*/model.onnx")}
    assert len(entries) == 2  # the two towers' optimised graphs (the suite pins cpu)
    off = tmp_path / "off.json"
    off.write_text(json.dumps({"session": {"optimized_model_cache_dir": None}}))
    shutil.rmtree(sessions)
    out = run("info", "--model", str(tiny_model_dir), "--config", str(off), env=home)
    assert out.returncode == 0, out.stderr
    assert not sessions.exists()
    own = tmp_path / "own.json"
    own.write_text(json.dumps({"session": {"optimized_model_cache_dir": str(tmp_path / "mine")}}))
    assert (
        run("info", "--model", str(tiny_model_dir), "--config", str(own), env=home).returncode == 0
    )
    assert not sessions.exists() and len(list((tmp_path / "mine").glob("*/model.onnx"))) == 2


def test_config_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps({"model": {"path": str(tiny_model_dir), "embedding_dim": 32}, "backend": "cpu"})
    )
    out = run("info", "--config", str(config))
    assert out.returncode == 0, out.stderr
    config.write_text(json.dumps({"model": {"path": str(tiny_model_dir)}, "max_batch_size": "big"}))
    out = run("info", "--config", str(config))
    assert out.returncode == 2 and "max_batch_size" in out.stderr


def test_errors_exit_2_with_a_message(tmp_path: Path) -> None:
    out = run("info", "--model", str(tmp_path / "missing"))
    assert out.returncode == 2 and "not found" in out.stderr and "Traceback" not in out.stderr
    out = run("embed")
    assert out.returncode == 2 and "nothing to embed" in out.stderr
    out = run("embed", "x.jpg", "--backend", "cuda")
    assert out.returncode == 2 and "CUDAExecutionProvider" in out.stderr


def test_demo_on_embedded_defaults(tmp_path: Path) -> None:
    out = run("demo", "--count", "6", "--gallery", str(tmp_path / "g"))
    assert "6 added" in out.stdout and "Image -> image" in out.stdout
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n  'a ") == 4  # four text queries, each with results
    assert len(list((tmp_path / "g").glob("*.jpg"))) == 6
    again = run("demo", "--count", "6", "--gallery", str(tmp_path / "g"))
    # a second run said "0 images indexed" beside an index of 6
    assert "6 images in the index (0 embedded this run)" in again.stdout, again.stdout


def test_search_says_when_a_filter_left_nothing_and_what_hybrid_scores_are(
    tmp_path: Path,
) -> None:
    # A date filter on undated photos answered "no photo matches this query" (the cut's words);
    # hybrid scores of 0.016 came with no word of what they are.
    gallery, index = tmp_path / "g", str(tmp_path / "g.db")
    assert run("demo", "--count", "6", "--gallery", str(gallery), "--index", index).returncode == 0
    where = '{"taken": {"$gte": "2023-07-01"}}'
    out = run("search", "a red circle", "--index", index, "--where", where)
    assert out.returncode == 0 and "(no results)" in out.stdout, out.stderr
    assert "no item matches --filter / --where" in out.stderr, out.stderr
    assert "no photo matches" not in out.stderr
    hybrid = run("search", "a red circle", "--index", index, "--hybrid")
    assert "about 0.016 is a first place" in hybrid.stderr, hybrid.stderr


def test_index_gives_the_plugins_vectors_to_the_bit_across_chunks(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``index`` decodes ahead while its session opens and across chunks (OnnxClipPlugin.prefetch):
    every stored vector is still exactly what ``generate_embedding_batch`` gives."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(23):  # --batch-size 4: chunks of 16, a window of 8 decoded ahead
        Image.fromarray(photo_like(64 + 4 * i, 48, i)).save(folder / f"{i:02d}.jpg")
    (folder / "07b.jpg").write_bytes(b"\xff\xd8 not a JPEG")  # fails alone, mid-run
    index = str(tmp_path / "i.db")
    out = run(
        "index", str(folder), "--index", index, "--model", str(tiny_model_dir), "--batch-size", "4"
    )
    assert out.returncode == 1 and "23 added" in out.stdout and "07b.jpg" in out.stdout
    from tests.helpers import make_plugin
    from themis_clip.index.search import VectorIndex

    paths = sorted(p.resolve() for p in folder.glob("*.jpg") if p.name != "07b.jpg")
    plugin = make_plugin(tiny_model_dir)
    try:
        expected = [r.embedding for r in plugin.generate_embedding_batch(paths)]
    finally:
        plugin.shutdown()
    with VectorIndex(index, readonly=True) as idx:
        stored = [idx.store.vector(str(p)) for p in paths]
    assert all(np.array_equal(a, b) for a, b in zip(stored, expected, strict=True))


def test_index_and_search(
    images: Path, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    index = str(tmp_path / "idx.db")
    (images / "bad.png").write_bytes(b"not a png")
    out = run("index", str(images), "--index", index, "--model", str(tiny_model_dir))
    assert out.returncode == 1, out.stderr  # README: 1 when some files were unreadable
    assert "2 added" in out.stdout and "1 unreadable" in out.stdout and "bad.png" in out.stdout
    again = run("index", str(images), "--index", index, "--model", str(tiny_model_dir))
    assert "0 added" in again.stdout and "2 unchanged" in again.stdout
    found = run(
        "search",
        "--image",
        str(images / "a.jpg"),
        "--index",
        index,
        "--model",
        str(tiny_model_dir),
        "--json",
    )
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)
    assert Path(hits[0]["path"]).name == "a.jpg" and hits[0]["score"] == pytest.approx(
        1.0, abs=1e-4
    )
    text = run(
        "search", "a red circle", "-k", "1", "--index", index, "--model", str(tiny_model_dir)
    )
    assert text.returncode == 0 and text.stdout.count("\n") == 1
    other = run("search", "a red circle", "--index", index, "--model", str(tiny_model_dir_b))
    assert other.returncode == 2 and "Re-index" in other.stderr
    missing = run(
        "search", "x", "--index", str(tmp_path / "none.db"), "--model", str(tiny_model_dir)
    )
    assert missing.returncode == 2 and "no index at" in missing.stderr
    both = run("search", "x", "--image", "y.png", "--index", index, "--model", str(tiny_model_dir))
    assert both.returncode == 2 and "y.png" in both.stderr  # TEXT and --image: both parts
    nothing = run("search", "--index", index, "--model", str(tiny_model_dir))
    assert nothing.returncode == 2 and "give a text query, --image FILE, or both" in nothing.stderr
    empty = run("search", "  ", "--index", index, "--model", str(tiny_model_dir))
    assert empty.returncode == 2 and "the text query is empty" in empty.stderr


def test_a_second_index_of_the_same_index_says_one_is_running(
    images: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # Two runs at once used to embed every new file twice (or race for a new index's schema).
    from themis_clip.files import file_lock

    index = str(tmp_path / "idx.db")
    with file_lock(Path(index + ".lock")):  # what a running `index` holds
        busy = run("index", str(images), "--index", index, "--model", str(tiny_model_dir))
    assert busy.returncode == 2, busy.stderr
    assert "another `themis-clip index` or `migrate` is updating" in busy.stderr
    assert not Path(index).exists()  # it touched nothing
    done = run("index", str(images), "--index", index, "--model", str(tiny_model_dir))
    assert done.returncode == 0 and "2 added" in done.stdout, done.stderr
