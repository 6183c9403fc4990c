"""kill -9 the indexer at random moments: the index survives whole, and finishing equals a clean run."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import photo_like
from themis_clip.index.stores.sqlite import IndexStore

pytestmark = pytest.mark.slow
FILES = 240


def committed(db: Path) -> int:
    """Rows committed so far, read the way a second process would (0 while nothing exists)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return int(con.execute("SELECT COUNT(*) FROM items").fetchone()[0])
    except sqlite3.Error:
        return 0


def vectors(db: Path) -> dict[str, np.ndarray]:
    with IndexStore(db, readonly=True) as store:
        assert store.integrity_ok()
        ids, matrix = store.load_vectors(32)
        items = store.items_by_id([int(i) for i in ids])
        return {items[int(i)].key: matrix[k] for k, i in enumerate(ids)}


@pytest.mark.parametrize("trials", [6, pytest.param(20, marks=pytest.mark.long)])
def test_kill_9_during_indexing(tmp_path: Path, tiny_model_dir: Path, trials: int) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(FILES):
        Image.fromarray(photo_like(640, 480, i % 40)).save(
            folder / f"{i:03d}.jpg", quality=85 + i % 10
        )
    exe = str(Path(sys.executable).parent / "themis-clip")

    def index(db: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                exe,
                "index",
                str(folder),
                "--index",
                str(db),
                "--model",
                str(tiny_model_dir),
                "--batch-size",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    reference_db = tmp_path / "clean.db"
    assert index(reference_db).wait(300) == 0
    reference = vectors(reference_db)
    assert len(reference) == FILES
    rng = random.Random(7)
    mid_run = 0
    for trial in range(trials):
        db = tmp_path / f"trial{trial}.db"
        proc = index(db)
        target = rng.randint(1, FILES - 1)  # kill once this many rows are committed
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and committed(db) < target:
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no cleanup of any kind
        proc.wait()
        if db.exists():
            partial = vectors(db)  # opens, passes integrity_check, every row whole
            assert len(partial) <= FILES
            for key, vec in partial.items():
                assert np.array_equal(vec, reference[key]), key  # no partial or wrong rows
            mid_run += 0 < len(partial) < FILES
        assert index(db).wait(300) == 0  # finish the interrupted run
        assert vectors(db).keys() == reference.keys()
        assert all(np.array_equal(v, reference[k]) for k, v in vectors(db).items())
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
    print(f"kill -9 trials: {trials}, landed mid-run: {mid_run}")
    assert mid_run >= trials * 3 // 4, f"only {mid_run} kills landed mid-run"
    shutil.rmtree(folder)
