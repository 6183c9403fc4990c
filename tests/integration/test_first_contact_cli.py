"""The CLI as a new user meets it (issue 26): exit codes, defaults, single messages, quiet
exports. Real subprocesses of the installed ``themis-clip`` command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.helpers import ServerProcess

# Each test starts real processes (a `themis-clip serve`, a Hub stand-in): the slower set.
pytestmark = pytest.mark.slow

EXE = str(Path(sys.executable).parent / "themis-clip")


def cli(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (40, 30), (220, 20, 20)).save(folder / "red.png")
    Image.new("RGB", (30, 40), (20, 20, 220)).save(folder / "blue.jpg")
    return folder


def test_index_exits_1_when_files_were_unreadable(photos: Path, tmp_path: Path) -> None:
    ok = cli("index", str(photos), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    # a small index keeps exact search: no plan line, no empty "search graph" bar
    assert "search" not in ok.stderr and "vec" not in ok.stderr, ok.stderr
    (photos / "broken.png").write_bytes(b"not a png at all")
    bad = cli("index", str(photos), cwd=tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "1 unreadable" in bad.stdout and "broken.png" in bad.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="FIFOs, /dev/zero and byte file names")
def test_index_skips_what_is_not_a_file_or_has_no_text_name(photos: Path, tmp_path: Path) -> None:
    """A FIFO named .jpg hung `index` for ever (in open), a link to /dev/zero span at 100 % CPU,
    and one file name that is not UTF-8 crashed the run with a traceback and kept its chunk out
    of the index on every run. Each is now one line of the report; the rest is indexed."""
    import os

    os.mkfifo(photos / "fifo.jpg")
    (photos / "zero.jpg").symlink_to("/dev/zero")
    Image.new("RGB", (20, 20), (20, 220, 20)).save(os.fsencode(photos) + b"/bad_\xff\xfe.png")
    out = cli("index", str(photos), cwd=tmp_path, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "2 added" in out.stdout and "2 unreadable" in out.stdout, out.stdout
    assert "fifo.jpg: not a regular file but a FIFO" in out.stdout
    # the link to /dev/zero leads out of the folder: never walked, never opened
    assert "not walked: 1 (link out of the folder 1)" in out.stdout, out.stdout
    assert "not valid UTF-8" in out.stdout and "bad_\\xff\\xfe.png" in out.stdout  # which one
    found = cli("search", "--image", str(photos / "fifo.jpg"), cwd=tmp_path, timeout=60)
    assert found.returncode == 2 and "not a regular file (a FIFO)" in found.stderr, found.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="newlines and escapes in file names")
def test_file_names_with_newlines_or_escapes_stay_on_their_own_line(
    photos: Path, tmp_path: Path
) -> None:
    """A name holding a newline split a report line in two (the second half looked like a line
    of its own), and an escape sequence drove the terminal. Both are now escaped."""
    (photos / "two\nlines.png").write_bytes(b"not a png")
    Image.new("RGB", (20, 20), (20, 220, 20)).save(photos / "green\x1b[2J.png")
    out = cli("index", str(photos), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    skipped = [line for line in out.stdout.splitlines() if line.startswith("  skipped ")]
    assert len(skipped) == 1 and "two\\nlines.png: " in skipped[0], out.stdout
    assert "\x1b" not in out.stdout
    found = cli("search", "--image", str(photos / "green\x1b[2J.png"), "-k", "1", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert "green\\x1b[2J.png" in found.stdout and "\x1b" not in found.stdout, found.stdout
    missing = cli("search", "--image", str(photos / "gone\x1b]0;pwned\x07.png"), cwd=tmp_path)
    assert missing.returncode == 2 and "not found" in missing.stderr, missing.stderr
    assert "\x1b" not in missing.stderr and "gone\\x1b]0;pwned\\x07.png" in missing.stderr


def test_a_file_that_became_unreadable_leaves_the_index(photos: Path, tmp_path: Path) -> None:
    """Its stored vector was of bytes no longer there: kept, searches returned a file that now
    holds garbage, with the old picture's score."""
    assert cli("index", str(photos), cwd=tmp_path).returncode == 0
    (photos / "red.png").write_bytes(b"garbage now")
    out = cli("index", str(photos), cwd=tmp_path)
    assert out.returncode == 1
    assert "1 removed" in out.stdout and "its earlier entry is removed" in out.stdout, out.stdout
    found = cli("search", "a red square", "-k", "5", "--json", "--cut", "none", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert "red.png" not in found.stdout and "blue.jpg" in found.stdout


def test_a_model_that_never_opens_leaves_no_index_behind(photos: Path, tmp_path: Path) -> None:
    """`index` opens the model while it walks the folder: an index it created for a model that
    then failed to open stayed, empty and bound to no model ("open read-only" to a search)."""
    import shutil

    from themis_clip import demo_model_path

    model = tmp_path / "model"
    shutil.copytree(demo_model_path(), model)
    manifest = json.loads((model / "manifest.json").read_text())
    for key in ("mean", "std", "resize_mode", "interpolation", "image_size"):
        manifest["visual"].pop(key)  # the default 224 then disagrees with the tower's 64
    (model / "manifest.json").write_text(json.dumps(manifest))
    out = cli("index", str(photos), "--index", "new.db", "--model", str(model), cwd=tmp_path)
    assert out.returncode == 2 and "cannot initialise the model" in out.stderr, out.stderr
    assert "or the default where they declare none" in out.stderr  # the 224 the user never set
    assert not list(tmp_path.glob("new.db*"))


def test_a_copy_of_an_unreadable_file_is_named_as_itself(photos: Path, tmp_path: Path) -> None:
    """Files of the same bytes are decoded once; a copy of one that failed said the first
    file's path as if it were its own error."""
    for name in ("a.png", "b.jpg"):
        (photos / name).write_bytes(b"junk")
    out = cli("index", str(photos), cwd=tmp_path)
    assert out.returncode == 1
    line = next(x for x in out.stdout.splitlines() if "b.jpg:" in x)
    assert "the same bytes as" in line and "a.png, which failed" in line, line


def test_a_config_of_a_few_settings_needs_no_model_section(photos: Path, tmp_path: Path) -> None:
    config = tmp_path / "draft.json"
    config.write_text('{"preprocess": {"decode_mode": "draft"}}')
    out = cli("index", str(photos), "--config", str(config), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 added" in out.stdout


def test_serve_uses_the_index_that_index_wrote(photos: Path, tmp_path: Path) -> None:
    assert cli("index", str(photos), cwd=tmp_path).returncode == 0
    assert (tmp_path / "themis-index.db").is_file()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)  # the server starts in the folder `index` ran in, with no --index
        with ServerProcess(["--no-warmup"]) as s:
            info = httpx.get(f"{s.base}/index/info", timeout=30)
    assert info.status_code == 200, info.text
    assert info.json()["items"] == 2


def test_model_errors_are_printed_once(tmp_path: Path) -> None:
    for command in (["embed", "--text", "a"], ["serve", "--port", "0"]):
        r = cli(*command, "--model", str(tmp_path / "missing"), timeout=60)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("model path not found") == 1, r.stderr
        assert r.stderr.startswith("themis-clip: error: ") and "Traceback" not in r.stderr


def test_serve_start_up_failures_are_messages_not_tracebacks(tmp_path: Path) -> None:
    r = cli("serve", "--port", "0", "--index", "postgresql://u@127.0.0.1:1/db", timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("themis-clip: error: cannot connect to PostgreSQL")
    assert "Traceback" not in r.stderr


def test_a_missing_index_is_refused_with_a_hint_that_keeps_its_path(tmp_path: Path) -> None:
    """`serve --index typo.db` served a new empty index while `search` refused the same path,
    and the hint to build one dropped `--index`, so following it built another file."""
    typo = tmp_path / "my photos.db"
    r = cli("serve", "--port", "0", "--index", str(typo), "--no-warmup", timeout=60)
    assert r.returncode == 2 and not typo.exists(), r.stderr
    assert f"--index '{typo}'" in r.stderr and "--new-index" in r.stderr, r.stderr
    r = cli("search", "x", "--index", str(typo), timeout=60)
    assert r.returncode == 2 and f"themis-clip index DIR --index '{typo}'" in r.stderr, r.stderr


def test_a_bare_command_prints_help_and_typos_get_a_suggestion() -> None:
    bare = cli(timeout=60)
    assert bare.returncode == 0 and "usage: themis-clip" in bare.stdout and not bare.stderr
    for args, wanted in (
        (["serach", "x"], "did you mean 'search'?"),
        (["search", "x", "--indx", "a.db"], "did you mean '--index'?"),
        (["index", ".", "--batchsize", "3"], "did you mean '--batch-size'"),
        (["models", "lst"], "did you mean 'list'?"),
    ):
        r = cli(*args, timeout=60)
        assert r.returncode == 2 and wanted in r.stderr, (args, r.stderr)


def test_embed_refuses_unknown_output_suffixes_and_bad_languages(tmp_path: Path) -> None:
    r = cli("embed", "--text", "a", "-o", str(tmp_path / "x.txt"))
    assert r.returncode == 2 and "unknown format '.txt'" in r.stderr
    assert not (tmp_path / "x.txt").exists()
    r = cli("embed", "--text", "a", "-o", str(tmp_path / "x.jsonl"))
    assert r.returncode == 0 and json.loads((tmp_path / "x.jsonl").read_text())["ok"]
    r = cli("embed", "--text", "a", "--language", "english")
    assert r.returncode == 2 and "'english' is not a Flores-200 code" in r.stderr
    r = cli("embed", "--text", "a", "--language", "deu_Latn")
    assert r.returncode == 0
    assert "warning: --language deu_Latn is ignored" in r.stderr


def test_verify_explains_bad_inputs(tmp_path: Path) -> None:
    model, ref, other = tmp_path / "model", tmp_path / "ref", tmp_path / "other"
    for folder in (model, ref, other):
        folder.mkdir()
    (model / "manifest.json").write_text('{"embedding_dim": 32}')
    (ref / "config.json").write_text('{"projection_dim": 32}')
    (other / "config.json").write_text('{"projection_dim": 16}')
    cases = [
        ((str(tmp_path / "nope"), str(ref)), "is not an exported model directory"),
        ((str(model), str(tmp_path / "nope")), "is not a transformers checkpoint folder"),
        ((str(model), str(other)), "makes 32-d embeddings but the reference"),
    ]
    for (m, r_), message in cases:
        r = cli("verify", m, "--reference", r_)
        assert r.returncode == 2 and message in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_export_is_quiet_but_keeps_real_warnings(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from themis_clip.export.hf import create_random_checkpoint
    from themis_clip.export.tokenizer import build_clip_tokenizer

    build_clip_tokenizer(tmp_path / "tokenizer.json")
    checkpoint = create_random_checkpoint(
        tmp_path / "tiny", tmp_path / "tokenizer.json", image_size=32, patch=8, seed=1
    )
    r = cli("export", str(checkpoint), str(tmp_path / "out"), "--precision", "fp32,int8")
    assert r.returncode == 0, r.stderr
    for noise in ("torchvision", "requires_grad", "pre-processing", "detach()"):
        assert noise not in r.stderr, r.stderr
    assert "calibrated on the built-in synthetic set" in r.stderr  # a real warning stays
    v = cli("verify", str(tmp_path / "out"), "--reference", str(checkpoint))
    assert v.returncode == 0, v.stdout + v.stderr
    assert "torchvision" not in v.stderr and "requires_grad" not in v.stderr


def test_a_folder_index_stores_file_metadata_for_filters(photos: Path, tmp_path: Path) -> None:
    (photos / "trips" / "rome").mkdir(parents=True)
    Image.new("RGB", (50, 20), (20, 200, 20)).save(photos / "trips" / "rome" / "green.png")
    assert cli("index", str(photos), cwd=tmp_path).returncode == 0

    def hits(*args: str) -> list[dict[str, object]]:
        r = cli(
            "search", "a green square", "--json", "-k", "10", "--cut", "none", *args, cwd=tmp_path
        )
        assert r.returncode == 0, r.stderr
        found: list[dict[str, object]] = json.loads(r.stdout)
        return found

    by_name = {h["metadata"]["name"]: h["metadata"] for h in hits()}  # type: ignore[index]
    assert set(by_name) == {"red.png", "blue.jpg", "green.png"}
    green = by_name["green.png"]
    assert green["folder"] == "trips/rome" and by_name["red.png"]["folder"] == "."
    assert (green["width"], green["height"]) == (50, 20)
    st = (photos / "trips" / "rome" / "green.png").stat()
    assert green["size"] == st.st_size and str(green["mtime"]).endswith("+00:00")
    only = hits("--filter", "folder=trips/rome")
    assert [h["metadata"]["name"] for h in only] == ["green.png"]  # type: ignore[index]
    assert [h["metadata"]["name"] for h in hits("--filter", "width=30")] == ["blue.jpg"]  # type: ignore[index]
    # A rename moves the row without re-embedding; its metadata follows the new name.
    (photos / "red.png").rename(photos / "trips" / "crimson.png")
    r = cli("index", str(photos), cwd=tmp_path)
    assert "1 renamed" in r.stdout, r.stdout
    moved = [h["metadata"] for h in hits() if h["metadata"]["name"] == "crimson.png"]  # type: ignore[index]
    assert moved and moved[0]["folder"] == "trips"  # type: ignore[index]


def test_classify_shows_the_raw_cosine(tmp_path: Path) -> None:
    from themis_clip.demo.scenes import Scene, render_scene

    render_scene(Scene(shape="circle", colour="red")).save(tmp_path / "circle.png")
    r = cli("classify", str(tmp_path / "circle.png"), "--labels", "car,dog,tree")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if "%" in line]
    assert len(rows) == 3 and all(" cosine " in row for row in rows), r.stdout
    assert "none fits" in r.stdout
    j = cli("classify", str(tmp_path / "circle.png"), "--labels", "car,dog", "--json")
    labels = json.loads(j.stdout)["labels"]
    assert all(isinstance(x["cosine"], float) and -1 <= x["cosine"] <= 1 for x in labels)


def test_the_demo_asks_what_its_gallery_holds_and_judges_each_top_hit(tmp_path: Path) -> None:
    r = cli("demo", "--count", "30", "--gallery", str(tmp_path / "g"))
    assert r.returncode == 0, r.stderr
    names = [p.name for p in (tmp_path / "g").iterdir()]
    queries = re.findall(
        r"^  '(a [^']+)'  \((\d+) right answers? in the gallery\)$", r.stdout, re.M
    )
    verdicts = re.findall(r"^  top hit: (right|WRONG)$", r.stdout, re.M)
    assert len(queries) == 4 and len(verdicts) == 4, r.stdout
    for text, count in queries:
        words = text.removeprefix("a ").split()
        colour, shape = [w for w in words if w not in ("small", "large")][:2]
        matching = [n for n in names if f"-{colour}-{shape}-" in n]
        assert int(count) >= 1 and matching, (text, names)
    right = verdicts.count("right")
    assert f"{right} of 4 top hits right" in r.stdout


def test_demo_never_writes_into_a_folder_of_the_users(tmp_path: Path) -> None:
    """`demo --gallery DIR` added generated images into an existing photo folder without asking
    and wrote its index into DIR's parent."""
    mine = tmp_path / "holiday"
    mine.mkdir()
    (mine / "beach.jpg").write_bytes(b"my photo")
    r = cli("demo", "--gallery", str(mine), "--count", "3", cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "beach.jpg" in r.stderr, r.stderr
    assert [p.name for p in mine.iterdir()] == ["beach.jpg"]
    gallery, index = tmp_path / "new" / "gallery", tmp_path / "demo.db"
    r = cli("demo", "--gallery", str(gallery), "--count", "3", "--index", str(index), timeout=120)
    assert r.returncode == 0, r.stderr
    assert index.is_file() and not (gallery.parent / "demo-index.db").exists()
    again = cli("demo", "--gallery", str(gallery), "--count", "3")
    assert again.returncode == 0, again.stderr  # its own gallery is reused, its index inside it
    assert (gallery / "demo-index.db").is_file() and "3 added" in again.stdout
    third = cli("demo", "--gallery", str(gallery), "--count", "3")
    assert third.returncode == 0 and "3 unchanged" in third.stdout, third.stdout + third.stderr


def test_wrong_input_is_said_not_silently_used(photos: Path, tmp_path: Path) -> None:
    """An --add path that does not exist was searched as text; `embed -o x.npy` with every input
    failed wrote a (2, 0) matrix; `classify` on an unreadable image still explained its
    probabilities; a TIFF's damaged metadata leaked Pillow's raw warning."""
    index = tmp_path / "i.db"
    assert cli("index", str(photos), "--index", str(index)).returncode == 0
    r = cli("search", "red", "--index", str(index), "--add", "holiday/missing.jpg")
    assert r.returncode == 2 and "no image file holiday/missing.jpg" in r.stderr, r.stderr
    r = cli("search", "red", "--index", str(index), "--add", "sunset", "-k", "1")
    assert r.returncode == 0, r.stderr  # a word is still a text part
    broken = [tmp_path / "a.png", tmp_path / "b.png"]
    for path in broken:
        path.write_bytes(b"not an image")
    out = tmp_path / "x.npy"
    r = cli("embed", *map(str, broken), "-o", str(out))
    import numpy as np

    matrix = np.load(out)
    assert r.returncode == 1 and matrix.shape[0] == 2 and matrix.shape[1] > 0, matrix.shape
    assert np.isnan(matrix).all()
    r = cli("classify", str(broken[0]), "--labels", "cat,dog")
    assert r.returncode == 1 and "probabilities" not in r.stdout, r.stdout
    tiff = tmp_path / "bad.tif"
    Image.new("RGB", (16, 16)).save(tiff, description="x" * 40)
    data = bytearray(tiff.read_bytes())
    import struct

    (ifd,) = struct.unpack("<I", data[4:8])
    (count,) = struct.unpack("<H", data[ifd : ifd + 2])
    for i in range(count):
        entry = ifd + 2 + 12 * i
        if struct.unpack("<H", data[entry : entry + 2])[0] == 270:  # ImageDescription
            data[entry + 8 : entry + 12] = struct.pack("<I", 10**6)
    tiff.write_bytes(bytes(data))
    r = cli("embed", str(tiff))
    assert "Warning" not in r.stderr and "warnings.warn" not in r.stderr, r.stderr


def test_index_walks_past_nas_junk_and_honours_exclude(photos: Path, tmp_path: Path) -> None:
    thumbs = photos / "@eaDir" / "red.png"
    thumbs.mkdir(parents=True)
    Image.new("RGB", (32, 32), (200, 200, 20)).save(thumbs / "SYNOPHOTO_THUMB_M.jpg")
    (photos / "._red.png").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    (photos / "screens").mkdir()
    Image.new("RGB", (32, 32), (20, 200, 200)).save(photos / "screens" / "s.png")
    index = tmp_path / "i.db"
    r = cli("index", str(photos), "--index", str(index), "--exclude", "screens")
    assert r.returncode == 0, r.stdout + r.stderr  # the AppleDouble file is no "unreadable"
    assert "2 added" in r.stdout and "not walked: 3" in r.stdout, r.stdout
    assert "@eaDir 1" in r.stdout and "--exclude screens 1" in r.stdout, r.stdout
    r = cli("index", str(photos), "--index", str(index))  # without --exclude: screens joins
    assert "1 added" in r.stdout, r.stdout
    r = cli("index", str(photos), "--index", str(index), "--exclude", "screens")
    assert "1 removed" in r.stdout, r.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="a read-only bind mount")
def test_an_index_on_read_only_media_is_searched_and_writing_says_why(
    photos: Path, tmp_path: Path
) -> None:
    """On read-only media an index without its -wal/-shm could not even be searched ("unable
    to open database file"), and writing to a read-only index was a traceback."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is missing")
    media = tmp_path / "media"
    media.mkdir()
    index = media / "photos.db"
    assert cli("index", str(photos), "--index", str(index)).returncode == 0
    assert not (media / "photos.db-wal").exists() and not (media / "photos.db-shm").exists()
    probe = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount --bind {media} {media} && mount -o remount,bind,ro {media} && touch {media}/x",
        ],
        capture_output=True,
        text=True,
    )
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"no read-only bind mount here: {probe.stderr.strip()}")
    inside = f"mount --bind {media} {media} && mount -o remount,bind,ro {media} && "
    search = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            inside + f"{EXE} search 'a red square' --cut none --index {index} -k 2 --json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert search.returncode == 0, search.stderr
    assert len(json.loads(search.stdout)) == 2
    write = subprocess.run(
        ["unshare", "-m", "sh", "-c", inside + f"{EXE} index {photos} --index {index}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert write.returncode == 2 and "Traceback" not in write.stderr, write.stderr
    assert "read-only" in write.stderr, write.stderr


def test_a_part_named_like_a_folder_here_is_text_with_a_note(photos: Path, tmp_path: Path) -> None:
    assert cli("index", str(photos), cwd=tmp_path).returncode == 0
    # "photos" is a word and a folder in the working directory: read as text, and said so
    found = cli("search", "a red square", "--add", "photos", "--cut", "none", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert "'photos' is read as text; a folder of that name is here" in found.stderr
    assert "red.png" in found.stdout
    plain = cli("search", "a red square", "--add", "sunset", "--cut", "none", cwd=tmp_path)
    assert plain.returncode == 0 and "read as text" not in plain.stderr, plain.stderr
