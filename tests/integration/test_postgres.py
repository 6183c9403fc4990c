"""PostgreSQL + pgvector end to end: two ``serve`` replicas on one database, and the CLI's
``index``/``search`` on a URL. A real server (``tests/pg.py``), real processes. (kill -9 during
indexing is ``test_crash.py``, one harness for both stores.)"""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.helpers import ServerProcess, photo_like

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def data_url(seed: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(photo_like(48, 40, seed)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_two_servers_on_one_database_see_each_others_writes(
    pg_url: str, tiny_model_dir: Path
) -> None:
    args = ["--model", str(tiny_model_dir), "--index", pg_url, "--no-warmup"]
    with ServerProcess(args) as a, ServerProcess(args) as b:
        added = httpx.post(
            f"{a.base}/index/items",
            json={
                "items": [
                    {"id": f"a{i}", "image": data_url(i), "metadata": {"by": "a"}} for i in range(3)
                ]
            },
            timeout=60,
        )
        assert added.status_code == 200, added.text
        # B answers from the same database at once: no file to copy, no reload.
        found = httpx.post(f"{b.base}/search", json={"item": "a1", "k": 2}, timeout=60).json()
        # "More like this" of a1 (which only A wrote) answers A's other items, never a1 itself.
        assert {h["id"] for h in found["results"]} == {"a0", "a2"}, found
        assert found["mode"] in ("exact", "pgvector")
        added = httpx.post(
            f"{b.base}/index/items",
            json={"items": [{"id": "b0", "image": data_url(40), "metadata": {"by": "b"}}]},
            timeout=60,
        )
        assert added.status_code == 200, added.text
        hits = httpx.post(
            f"{a.base}/search", json={"item": "a0", "k": 5, "filters": {"by": "b"}}, timeout=60
        ).json()["results"]
        assert [h["id"] for h in hits] == ["b0"] and hits[0]["metadata"] == {"by": "b"}
        info = httpx.get(f"{a.base}/index/info", timeout=30).json()
        assert info["items"] == 4
        thumb = httpx.get(f"{a.base}/items/b0/thumbnail", timeout=30)  # B's thumbnail, via A
        assert thumb.status_code == 200 and thumb.content[:2] == b"\xff\xd8"
        bad = httpx.post(f"{a.base}/search", json={"item": "a1", "filters": {"colour": 1}})
        assert bad.status_code == 422 and "colour" in bad.text


def test_cli_index_and_search_on_a_url(pg_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(6):
        Image.fromarray(photo_like(64, 48, i)).save(folder / f"{i}.png")
    exe = str(Path(sys.executable).parent / "themis-clip")
    model = ["--model", str(tiny_model_dir)]
    run = subprocess.run(
        [exe, "index", str(folder), "--index", pg_url, *model],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "6 added" in run.stdout and "search: HNSW graph" in run.stderr  # pgvector builds one
    again = subprocess.run(
        [exe, "index", str(folder), "--index", pg_url, *model],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "6 unchanged" in again.stdout, again.stdout + again.stderr
    found = subprocess.run(
        [exe, "search", "--image", str(folder / "3.png"), "--index", pg_url, "-k", "1", *model],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert found.returncode == 0 and "3.png" in found.stdout, found.stdout + found.stderr
    # A bad URL is one clear line, not a traceback.
    bad = subprocess.run(
        [exe, "search", "x", "--index", "postgresql://nobody@/x?host=/nonexistent", *model],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "cannot connect to PostgreSQL" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_second_index_run_on_a_database_says_one_is_running(
    pg_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # Two runs at once used to interleave, each embedding every new file (as SQLite's
    # INDEX.lock prevents for a file).
    from themis_clip.index.stores.postgres import writer_lock

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        Image.fromarray(photo_like(64, 48, i)).save(folder / f"{i}.png")
    exe = str(Path(sys.executable).parent / "themis-clip")
    cmd = [exe, "index", str(folder), "--index", pg_url, "--model", str(tiny_model_dir)]
    with writer_lock(pg_url):  # what a running `index` holds
        busy = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert busy.returncode == 2, busy.stderr
    assert "another `themis-clip index` is updating" in busy.stderr
    assert "Traceback" not in busy.stderr
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "2 added" in done.stdout, done.stderr
