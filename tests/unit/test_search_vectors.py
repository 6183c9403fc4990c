"""The float32 vectors beside the graph (issue 30, item 4): candidates are re-scored from a
memory-mapped file, never a stale or wrong one, and writes since the file are seen."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import DIM, STAMP, unit
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.index.stores.sqlite import SQLiteStore
from themis_clip.index.vectors import VECTORS_SUFFIX, VectorTable

N = 300


def built(path: Path) -> Path:
    """An index of ``N`` items with a saved i8 graph and its vectors file; returns that file."""
    with VectorIndex(path, exact_threshold=50) as index:
        index.bind_model(STAMP)
        index.store.upsert([ItemRow(key=f"k{i}", vector=unit(i)) for i in range(N)], dim=DIM)
        assert index.prepare_graph()
    vectors = Path(str(path) + VECTORS_SUFFIX)
    assert vectors.is_file()
    return vectors


def exact_score(key: str, query: np.ndarray, path: Path) -> float:
    with SQLiteStore(path, readonly=True) as store:
        vector = store.vector(key)
    assert vector is not None
    return float(vector @ query)


def test_candidates_are_rescored_from_the_file_not_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "i.db"
    built(path)
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        assert ro.search(unit(3), 1)[0].key == "k3"  # opened: the graph and the file
        assert ro.stats()["graph"]["rescored_from"] == "vectors file"

        def no_rows(*args: object) -> object:
            raise AssertionError("a candidate's vector was read from SQLite")

        monkeypatch.setattr(ro.store, "vectors_by_id", no_rows)
        for i in (5, 77, 250):
            hits = ro.search(unit(i), 10)
            assert hits[0].key == f"k{i}" and hits[0].score == pytest.approx(1.0, abs=1e-6)
            for hit in hits:  # exact float32 scores, not the i8 graph's rough ones
                assert hit.score == pytest.approx(exact_score(hit.key, unit(i), path), abs=1e-6)


def test_a_stale_vectors_file_is_never_used(tmp_path: Path) -> None:
    path = tmp_path / "i.db"
    vectors = built(path)
    old = tmp_path / "old.vectors"
    shutil.copy(vectors, old)
    with VectorIndex(path, exact_threshold=50) as index:  # k5 moves; the file is rewritten
        index.store.upsert([ItemRow(key="k5", vector=unit(5_000))], dim=DIM)
        index.prepare_graph()
    shutil.copy(old, vectors)  # the earlier file back, beside the newer graph
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        hit = ro.search(unit(5_000), 1)[0]
        assert hit.key == "k5" and hit.score == pytest.approx(1.0, abs=1e-6)
        assert ro.stats()["graph"]["rescored_from"] == "store"


def test_a_vectors_file_that_disagrees_with_the_store_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "i.db"
    vectors = built(path)
    opened = VectorTable.open(vectors, dim=DIM, count=N)
    assert opened is not None
    table, version = opened
    wrong = -np.asarray(table.matrix)  # right header, right ids, every row wrong
    VectorTable.save(vectors, np.asarray(table.ids), wrong, version=version)
    del table
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        hits = ro.search(unit(9), 5)
        assert hits[0].key == "k9" and hits[0].score == pytest.approx(1.0, abs=1e-6)
        assert ro.stats()["graph"]["rescored_from"] == "store"


def test_writes_after_the_file_are_rescored_with_their_new_vectors(tmp_path: Path) -> None:
    path = tmp_path / "i.db"
    built(path)
    with VectorIndex(path, exact_threshold=50) as index:  # writable: the graph catches up
        assert index.search(unit(1), 1)[0].key == "k1"
        index.store.upsert(
            [ItemRow(key="k7", vector=unit(7_000)), ItemRow(key="new", vector=unit(8_000))],
            dim=DIM,
        )
        index.store.delete_keys(["k8"])
        moved = index.search(unit(7_000), 1)[0]
        assert moved.key == "k7" and moved.score == pytest.approx(1.0, abs=1e-6)
        assert index.search(unit(8_000), 1)[0].key == "new"
        assert all(h.key != "k8" for h in index.search(unit(8), 10))
        assert index.stats()["graph"]["rescored_from"] == "vectors file"
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:  # saved on close
        moved = ro.search(unit(7_000), 1)[0]
        assert moved.key == "k7" and moved.score == pytest.approx(1.0, abs=1e-6)
        assert ro.stats()["graph"]["rescored_from"] == "vectors file"


def test_an_index_without_a_vectors_file_searches_from_the_store_and_gains_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "i.db"
    built(path).unlink()  # as an index saved before vectors files
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        assert ro.search(unit(4), 1)[0].key == "k4"
        assert ro.stats()["graph"]["rescored_from"] == "store"
    with VectorIndex(path, exact_threshold=50) as rw:
        assert rw.prepare_graph() is False  # no new graph: the file is written beside it
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        assert ro.search(unit(4), 1)[0].key == "k4"
        assert ro.stats()["graph"]["rescored_from"] == "vectors file"
    VectorIndex.remove(path)
    assert not any(f.exists() for f in VectorIndex.files(path))


def test_vector_table_lookup_prefers_newer_rows_and_reports_missing_ids() -> None:
    ids = np.array([3, 1, 2], np.int64)
    table = VectorTable.of(ids, np.eye(3, dtype=np.float32)[[2, 0, 1]])  # unsorted in
    assert table.ids.tolist() == [1, 2, 3]
    newer = table.with_rows(np.array([2, 9]), np.full((2, 3), 5, np.float32))
    vectors, found = newer.lookup(np.array([9, 1, 2, 4]))
    assert found.tolist() == [True, True, True, False]
    assert vectors.tolist() == [[5, 5, 5], [1, 0, 0], [5, 5, 5], [0, 0, 0]]
    assert table.lookup(np.array([2]))[0].tolist() == [[0, 1, 0]]  # the original is unchanged


@pytest.mark.parametrize("spread", [1, 3])  # dense ids (a row map), then sparse (a binary search)
def test_vector_table_finds_every_id_and_no_other(spread: int) -> None:
    rng = np.random.default_rng(spread)
    ids = np.unique(rng.integers(1, 5_000 * spread, 4_000)).astype(np.int64)
    matrix = rng.standard_normal((len(ids), 4)).astype(np.float32)
    table = VectorTable.of(ids, matrix)
    assert (table._row_map is not None) == (spread == 1)
    probe = np.arange(-2, int(ids[-1]) + 3, dtype=np.int64)
    vectors, found = table.lookup(probe)
    assert np.array_equal(found, np.isin(probe, ids))
    assert np.array_equal(vectors[found], matrix) and not vectors[~found].any()
    newer = table.with_rows(ids[:2], np.ones((2, 4), np.float32))
    vectors, found = newer.lookup(probe)
    assert np.array_equal(found, np.isin(probe, ids))
    assert np.array_equal(vectors[found], np.concatenate([np.ones((2, 4)), matrix[2:]]))


@pytest.mark.parametrize("damage", ["truncated", "foreign", "half-written"])
def test_a_damaged_vectors_file_falls_back_to_the_store(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "i.db"
    vectors = built(path)
    data = vectors.read_bytes()
    if damage == "truncated":
        vectors.write_bytes(data[: len(data) - 7])
    elif damage == "foreign":
        vectors.write_bytes(b"not a vectors file" + data[18:])
    else:  # killed while writing: the temporary file is left, the real one gone
        vectors.rename(vectors.with_name(vectors.name + ".tmp"))
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        hits = ro.search(unit(21), 3)
        assert hits[0].key == "k21" and hits[0].score == pytest.approx(1.0, abs=1e-6)
        assert ro.stats()["graph"]["rescored_from"] == "store"
    with VectorIndex(path, exact_threshold=50) as rw:  # a writable open writes a good one
        rw.prepare_graph()
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        assert ro.search(unit(21), 1)[0].key == "k21"
        assert ro.stats()["graph"]["rescored_from"] == "vectors file"
