"""kill -9 the indexer at random moments: the index survives whole, and finishing equals a clean
run. One harness, both stores: an SQLite file and a PostgreSQL database (a real server)."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import photo_like
from tests.pg import PgServer
from themis_clip.index.stores import open_store

pytestmark = pytest.mark.slow


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where the trials write: a fresh location each time, and how many rows another process
    sees committed there (0 while nothing exists)."""

    fresh: Callable[[str], str]
    committed: Callable[[str], int]
    exists: Callable[[str], bool]
    cleanup: Callable[[str], None] = lambda location: None


def vectors(location: str) -> dict[str, np.ndarray]:
    store = open_store(location, readonly=True)
    try:
        assert store.integrity_ok()
        ids, matrix = store.load_vectors(32)
        items = store.items_by_id([int(i) for i in ids])
        return {items[int(i)].key: matrix[k] for k, i in enumerate(ids)}
    finally:
        store.close()


def kill_9_trials(
    tmp_path: Path,
    model: Path,
    target: Target,
    *,
    files: int,
    size: tuple[int, int],
    trials: int,
    seed: int,
) -> int:
    """Index ``files`` photos cleanly once, then ``trials`` times kill -9 the indexer once a
    random number of rows is committed, check every row left is whole and right, and finish the
    run: it must equal the clean one. Returns how many kills landed mid-run."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(files):
        Image.fromarray(photo_like(*size, i % 40)).save(
            folder / f"{i:03d}.jpg", quality=85 + i % 10
        )
    exe = str(Path(sys.executable).parent / "themis-clip")

    def index(location: str) -> subprocess.Popen[bytes]:
        cmd = [exe, "index", str(folder), "--index", location, "--model", str(model)]
        return subprocess.Popen(
            [*cmd, "--batch-size", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    clean = target.fresh("clean")
    assert index(clean).wait(300) == 0
    reference = vectors(clean)
    assert len(reference) == files
    rng = random.Random(seed)
    mid_run = 0
    for trial in range(trials):
        location = target.fresh(f"trial{trial}")
        proc = index(location)
        wanted = rng.randint(1, files - 1)  # kill once this many rows are committed
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if target.committed(location) >= wanted:
                break
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no cleanup of any kind
        proc.wait()
        if target.exists(location):
            partial = vectors(location)  # opens, passes its integrity check, every row whole
            assert len(partial) <= files
            for key, vec in partial.items():
                assert np.array_equal(vec, reference[key]), key  # no partial or wrong rows
            mid_run += 0 < len(partial) < files
        assert index(location).wait(300) == 0  # finish the interrupted run
        finished = vectors(location)
        assert finished.keys() == reference.keys()
        assert all(np.array_equal(v, reference[k]) for k, v in finished.items())
        target.cleanup(location)
    print(f"kill -9 trials: {trials}, landed mid-run: {mid_run}")
    shutil.rmtree(folder)
    return mid_run


def sqlite_target(tmp_path: Path) -> Target:
    def committed(location: str) -> int:
        if not Path(location).exists():
            return 0
        try:
            with sqlite3.connect(f"file:{location}?mode=ro", uri=True, timeout=1) as con:
                return int(con.execute("SELECT COUNT(*) FROM items").fetchone()[0])
        except sqlite3.Error:
            return 0

    def cleanup(location: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(location + suffix).unlink(missing_ok=True)

    return Target(
        fresh=lambda name: str(tmp_path / f"{name}.db"),
        committed=committed,
        exists=lambda location: Path(location).exists(),
        cleanup=cleanup,
    )


def postgres_target(server: PgServer) -> Target:
    databases: dict[str, str] = {}

    def fresh(_name: str) -> str:
        database = server.new_database()
        url = server.url(database)
        databases[url] = database
        return url

    def committed(url: str) -> int:
        try:
            rows = server.admin("SELECT count(*) FROM themis_items", database=databases[url])
        except Exception:  # not created yet
            return 0
        return int(rows[0][0])

    def exists(url: str) -> bool:  # the schema is there (the store opens read-only)
        rows = server.admin("SELECT to_regclass('themis_meta')", database=databases[url])
        return rows[0][0] is not None

    return Target(fresh=fresh, committed=committed, exists=exists)


@pytest.mark.parametrize("trials", [6, pytest.param(20, marks=pytest.mark.long)])
def test_kill_9_during_indexing(tmp_path: Path, tiny_model_dir: Path, trials: int) -> None:
    target = sqlite_target(tmp_path)
    mid_run = kill_9_trials(
        tmp_path, tiny_model_dir, target, files=240, size=(640, 480), trials=trials, seed=7
    )
    assert mid_run >= trials * 3 // 4, f"only {mid_run} kills landed mid-run"


@pytest.mark.postgres
def test_kill_9_during_pgvector_indexing(
    pg_server: PgServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Killed at random moments, the database holds only whole rows (the server rolls the open
    transaction back), and finishing the run gives exactly the clean run's index."""
    trials = 4
    mid_run = kill_9_trials(
        tmp_path,
        tiny_model_dir,
        postgres_target(pg_server),
        files=120,
        size=(320, 240),
        trials=trials,
        seed=3,
    )
    assert mid_run >= trials // 2, f"only {mid_run} kills landed mid-run"


def test_sigterm_during_indexing_stops_with_one_line_and_the_run_resumes(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """SIGTERM (a service manager's stop, `timeout`) ended the run silently with code 143.
    It now stops as Ctrl-C does: one line saying why, the rows committed kept whole, and the
    next run finishes the folder."""
    import signal

    folder = tmp_path / "photos"
    folder.mkdir()
    files = 160
    for i in range(files):
        Image.fromarray(photo_like(320, 240, i % 40)).save(folder / f"{i:03d}.jpg")
    target = sqlite_target(tmp_path)
    location = target.fresh("t")
    exe = str(Path(sys.executable).parent / "themis-clip")
    cmd = [exe, "index", str(folder), "--index", location, "--model", str(tiny_model_dir)]
    proc = subprocess.Popen(
        [*cmd, "--batch-size", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and target.committed(location) < 4:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "themis-clip: stopped (SIGTERM)" in err and "Traceback" not in err, err
    kept = vectors(location)
    assert 0 < len(kept) < files
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert len(vectors(location)) == files
