from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import DIM, STAMP, FakeEmbedder, unit, write_png
from themis_clip import IndexModelMismatchError, MetadataError, SearchIndexError
from themis_clip.index.ann import HNSWIndex
from themis_clip.index.indexer import index_folder, walk_images
from themis_clip.index.search import VectorIndex, top_k
from themis_clip.index.stores import ItemRow
from themis_clip.index.stores.sqlite import SCHEMA_VERSION, SQLiteStore
from themis_clip.index.where import with_filters
from themis_clip.index.wheresql import compile_sqlite
from themis_clip.vocabulary import ModelIdentity

# -- store -------------------------------------------------------------------------------------


def test_store_roundtrip_and_transactions(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "i.db") as store:
        store.upsert(
            [
                ItemRow(key="a", vector=unit(1), metadata={"tag": "x"}),
                ItemRow(key="b", vector=unit(2)),
            ],
            dim=DIM,
        )
        assert store.count() == 2 and store.get("a").metadata == {"tag": "x"}  # type: ignore[union-attr]
        assert np.array_equal(store.vector("b"), unit(2))
        v0 = store.write_version

        def failing_write() -> None:
            with store.transaction() as db:
                db.execute("DELETE FROM items")
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            failing_write()
        assert store.count() == 2 and store.write_version == v0  # rolled back whole
        with pytest.raises(SearchIndexError, match="vector shape"):
            store.upsert([ItemRow(key="c", vector=np.zeros(3, np.float32))], dim=DIM)
        assert store.delete_keys(["a", "zzz"]) == 1 and store.integrity_ok()


def test_store_refuses_a_newer_schema(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "i.db").close()
    db = sqlite3.connect(tmp_path / "i.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(SearchIndexError, match="newer than this themis-clip supports"):
        SQLiteStore(tmp_path / "i.db")


def test_stores_opened_at_once_on_a_new_file_create_its_schema_once(tmp_path: Path) -> None:
    # The version used to be read outside the write transaction: the second opener then ran
    # the first migration again ("table meta already exists").
    def open_store(path: Path, start: threading.Barrier, errors: list[BaseException]) -> None:
        start.wait()
        try:
            SQLiteStore(path).close()
        except BaseException as exc:
            errors.append(exc)

    for round_ in range(25):  # the WAL switch raced in about 3% of rounds
        path = tmp_path / f"new{round_}.db"
        start = threading.Barrier(6)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=open_store, args=(path, start, errors)) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        with SQLiteStore(path) as store:
            (version,) = store._db.execute("PRAGMA user_version").fetchone()
            assert version == SCHEMA_VERSION


def test_filters_are_answered_from_the_fields_index(tmp_path: Path) -> None:
    """A filter term is one range of the ``fields`` index, not a scan of every item's JSON
    (issue: 32 missing keys over 2,000 items with ~500 keys each took 6.6 s)."""
    with SQLiteStore(tmp_path / "i.db") as store:
        store.upsert(
            [
                ItemRow(key=f"k{i}", vector=unit(i), metadata={f"m{j}": j for j in range(50)})
                for i in range(20)
            ],
            dim=DIM,
        )
        sql, params = compile_sqlite(with_filters({"m3": 3, "m4": 4.0}))  # what ids_where runs
        plan = " ".join(
            str(row[-1])
            for row in store._db.execute(
                f"EXPLAIN QUERY PLAN SELECT id FROM items WHERE {sql}", params
            )
        )
        assert "fields_value" in plan and "SCAN" not in plan
        assert len(store.ids_where(with_filters({"m3": 3, "m4": 4.0}))) == 20
        assert store.ids_where(with_filters({f"missing{j}": 1 for j in range(32)})) == set()
        assert store.metadata_keys_present(["m1", "nope"]) == {"m1"}


def test_migration_to_v5_indexes_the_metadata_already_stored(tmp_path: Path) -> None:
    path = tmp_path / "i.db"
    with SQLiteStore(path) as store:
        store.upsert(
            [ItemRow(key=f"k{i}", vector=unit(i), metadata={"even": i % 2 == 0}) for i in range(6)]
            + [ItemRow(key="bare", vector=unit(9))],
            dim=DIM,
        )
    db = sqlite3.connect(path)  # back to what version 4 wrote: no fields table
    db.execute("DROP TABLE fields")
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    with SQLiteStore(path) as store:
        items = store.items_by_id(list(store.ids_where(with_filters({"even": True}))))
        assert sorted(item.key for item in items.values()) == ["k0", "k2", "k4"]
        assert store.metadata_facets()[0]["count"] == 6


def test_store_readonly_and_garbage(tmp_path: Path) -> None:
    with pytest.raises(SearchIndexError, match="no index at"):
        SQLiteStore(tmp_path / "missing.db", readonly=True)
    (tmp_path / "bad.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(SearchIndexError, match="cannot open index"):
        SQLiteStore(tmp_path / "bad.db")


# -- search ------------------------------------------------------------------------------------


def test_top_k_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    m = rng.standard_normal((500, DIM)).astype(np.float32)
    q = rng.standard_normal(DIM).astype(np.float32)
    rows, scores = top_k(m, q, 10)
    brute = np.argsort(-(m @ q))[:10]
    assert rows.tolist() == brute.tolist() and np.allclose(scores, (m @ q)[brute])
    assert len(top_k(m, q, 1000)[0]) == 500 and len(top_k(m[:0], q, 5)[0]) == 0


@pytest.mark.parametrize("threshold", [10_000, 50])  # exact, then HNSW
def test_search_exact_and_hnsw(tmp_path: Path, threshold: int) -> None:
    path = tmp_path / "i.db"
    with VectorIndex(path, exact_threshold=threshold) as index:
        index.bind_model(STAMP)
        vectors = [unit(i) for i in range(300)]
        index.store.upsert(
            [
                ItemRow(key=f"k{i}", vector=v, metadata={"even": i % 2 == 0})
                for i, v in enumerate(vectors)
            ],
            dim=DIM,
        )
        assert index.mode == ("exact" if threshold > 300 else "hnsw")
        hits = index.search(vectors[42], 5)
        assert hits[0].key == "k42" and hits[0].score == pytest.approx(1.0, abs=1e-5)
        brute = np.argsort(-(np.stack(vectors) @ vectors[7]))[:10]
        got = [int(h.key[1:]) for h in index.search(vectors[7], 10)]
        assert len(set(got) & set(brute.tolist())) >= 9
        odd = index.search(vectors[42], 5, where=with_filters({"even": False}))
        assert odd and all(h.metadata == {"even": False} for h in odd)
        index.store.delete_keys(["k42"])  # a write invalidates the cached matrix / graph
        assert index.search(vectors[42], 1)[0].key != "k42"
    if threshold == 50:
        assert Path(str(path) + ".usearch").is_file()
        with VectorIndex(
            path, readonly=True, exact_threshold=threshold
        ) as ro:  # memory-mapped graph
            assert ro.search(vectors[8], 1)[0].key == "k8"


def test_index_refuses_another_model(tmp_path: Path) -> None:
    with VectorIndex(tmp_path / "i.db") as index:
        index.bind_model(STAMP)
        index.bind_model(STAMP)
        other = ModelIdentity.from_model_id("other@123", sha256="cd" * 32, dim=DIM)
        with pytest.raises(IndexModelMismatchError, match="Re-index"):
            index.bind_model(other)
        with pytest.raises(IndexModelMismatchError, match="3 dimensions"):
            index.search(np.ones(3, np.float32), 1)


# -- indexer -----------------------------------------------------------------------------------


def test_incremental_indexing(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    for i in range(6):
        write_png(folder / ("sub" if i % 2 else "") / f"{i}.png", i)
    (folder / "broken.jpg").write_bytes(b"GIF? no: not an image")
    (folder / "notes.txt").write_text("not an image")
    (folder / ".hidden").mkdir()
    write_png(folder / ".hidden" / "h.png", 99)
    assert len(walk_images(folder)) == 7
    embedder = FakeEmbedder()
    with VectorIndex(tmp_path / "i.db") as index:
        r = index_folder(index, folder, embedder, stamp=STAMP, chunk=4, progress=False)
        assert (r.added, r.unchanged, len(r.failed)) == (6, 0, 0) or (r.added, len(r.failed)) == (
            6,
            1,
        )
        broken_errors = [e for p, e in r.failed if p.endswith("broken.jpg")]
        assert broken_errors == ["not a recognised image format"]
        # Second run: nothing re-embedded, the unreadable file listed again but not retried.
        embedder.embedded.clear()
        r = index_folder(index, folder, embedder, stamp=STAMP, progress=False)
        assert (
            r.unchanged == 6 and r.embedded == 0 and embedder.embedded == [] and len(r.failed) == 1
        )
        # Rename: no embedding, the row moves. Duplicate: no embedding, vector copied.
        os.rename(folder / "0.png", folder / "zero.png")
        (folder / "copy-of-2.png").write_bytes((folder / "2.png").read_bytes())
        # Change: re-embedded. Removal: dropped.
        write_png(folder / "4.png", 444)
        (folder / "sub" / "5.png").unlink()
        r = index_folder(index, folder, embedder, stamp=STAMP, progress=False)
        assert (r.renamed, r.duplicates, r.updated, r.removed) == (1, 1, 1, 1)
        assert embedder.embedded == [str((folder / "4.png").resolve())]
        assert index.store.get(str((folder / "zero.png").resolve())) is not None
        assert index.store.get(str((folder / "0.png").resolve())) is None
        assert index.store.count() == 6
        hit = index.search(unit((folder / "2.png").read_bytes()), 2)
        assert {Path(h.path or "").name for h in hit} == {"2.png", "copy-of-2.png"}


def test_interrupted_run_resumes_without_re_embedding(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    for i in range(10):
        write_png(folder / f"{i:02d}.png", i)
    with VectorIndex(tmp_path / "i.db") as index:
        crashing = FakeEmbedder(crash_after=4)
        with pytest.raises(KeyboardInterrupt):
            index_folder(index, folder, crashing, stamp=STAMP, chunk=4, progress=False)
        assert index.store.count() == 4  # the committed chunk survived, nothing partial
        resumed = FakeEmbedder()
        r = index_folder(index, folder, resumed, stamp=STAMP, chunk=4, progress=False)
        assert r.unchanged == 4 and r.added == 6 and len(resumed.embedded) == 6
    with VectorIndex(tmp_path / "clean.db") as clean:
        index_folder(clean, folder, FakeEmbedder(), stamp=STAMP, progress=False)
        _, a = SQLiteStore(tmp_path / "i.db").load_vectors(DIM)
        _, b = clean.store.load_vectors(DIM)
        assert np.array_equal(np.sort(a, axis=0), np.sort(b, axis=0))


# -- HNSW graph off the request path ---------------------------------------------------------


def filled(path: Path, n: int, *, threshold: int = 50, **kw: object) -> VectorIndex:
    index = VectorIndex(path, exact_threshold=threshold, **kw)  # type: ignore[arg-type]
    index.bind_model(STAMP)
    index.store.upsert([ItemRow(key=f"k{i}", vector=unit(i)) for i in range(n)], dim=DIM)
    return index


def wait_built(index: VectorIndex) -> None:
    deadline = time.monotonic() + 60
    while index.graph_building:
        assert time.monotonic() < deadline, "background build did not finish"
        time.sleep(0.01)


def test_background_build_serves_exact_results_until_the_graph_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real_build = HNSWIndex.build.__func__  # type: ignore[attr-defined]
    threads_used: list[int] = []

    def slow_build(cls: type[HNSWIndex], *a: object, **kw: object) -> HNSWIndex:
        threads_used.append(int(kw["threads"]))  # type: ignore[call-overload]
        assert gate.wait(30)
        return real_build(cls, *a, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(HNSWIndex, "build", classmethod(slow_build))
    index = filled(tmp_path / "i.db", 300, background_build=True)
    ann = Path(str(tmp_path / "i.db") + ".usearch")
    assert index.mode == "exact"
    hits = index.search(unit(42), 5)  # does not wait for the (blocked) build
    assert hits[0].key == "k42" and index.mode == "exact" and index.graph_building
    deadline = time.monotonic() + 30
    while not threads_used:  # the tuner measures exact search first, then builds
        assert time.monotonic() < deadline, "the background build never started"
        time.sleep(0.01)
    assert threads_used == [max(1, (os.cpu_count() or 2) // 2)]
    # A write while the graph builds makes that graph stale: exact search sees the new item.
    index.store.upsert([ItemRow(key="new", vector=unit(1000))], dim=DIM)
    assert index.search(unit(1000), 1)[0].key == "new"
    gate.set()
    wait_built(index)
    # Collects the graph, built before the write, and catches it up (no second build).
    assert index.search(unit(1000), 1)[0].key == "new"
    assert index.mode == "hnsw" and ann.is_file() and len(threads_used) == 1
    index.close()
    with VectorIndex(tmp_path / "i.db", readonly=True, exact_threshold=50) as ro:
        assert ro.mode == "hnsw"  # the saved graph matches the store
        assert ro.search(unit(8), 1)[0].key == "k8"


def test_a_failed_background_build_leaves_exact_search_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(cls: type[HNSWIndex], *a: object, **kw: object) -> HNSWIndex:
        raise MemoryError("no room for the graph")

    monkeypatch.setattr(HNSWIndex, "build", classmethod(broken))
    index = filled(tmp_path / "i.db", 120, background_build=True)
    assert index.search(unit(3), 1)[0].key == "k3"
    wait_built(index)
    with caplog.at_level("WARNING"):
        assert index.search(unit(4), 1)[0].key == "k4"
    assert "no room for the graph" in caplog.text and index.mode == "exact"
    index.close()


def test_read_only_without_a_graph_searches_exactly_and_prepare_graph_builds_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "i.db"
    filled(path, 200).close()
    ann = Path(str(path) + ".usearch")
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        assert ro.mode == "exact"
        assert ro.search(unit(11), 1)[0].key == "k11"
    assert not ann.exists()
    with VectorIndex(path, exact_threshold=50) as rw:
        assert rw.prepare_graph() is True
        assert rw.prepare_graph() is False  # already current
    assert ann.is_file()
    with VectorIndex(path, readonly=True, exact_threshold=50) as ro:
        assert ro.mode == "hnsw"
        assert ro.search(unit(12), 1)[0].key == "k12"
    with VectorIndex(path, exact_threshold=10_000) as small:
        assert small.prepare_graph() is False  # below the threshold no graph is needed


def test_searches_do_not_wait_for_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28, 2.3: readers serialised behind one lock (six slow filters made plain searches
    time out). A search held inside its scan must not stop another one."""
    import themis_clip.index.searchers.structures as local  # the searches' numpy kernels

    index = VectorIndex(tmp_path / "i.db", exact_threshold=10**9)  # always exact
    index.bind_model(STAMP)
    index.store.upsert([ItemRow(key=f"k{i}", vector=unit(i)) for i in range(50)], dim=DIM)
    assert index.search(unit(1), 1)[0].key == "k1"  # the matrix is loaded
    entered, release = threading.Event(), threading.Event()
    real = local.top_k

    def held(*args: object) -> object:
        if threading.current_thread().name == "held":
            entered.set()
            release.wait(30)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(local, "top_k", held)
    first = threading.Thread(target=lambda: index.search(unit(3), 2), name="held")
    first.start()
    try:
        assert entered.wait(10)
        done = threading.Event()
        got: list[str] = []

        def second() -> None:
            got.append(index.search(unit(4), 1)[0].key)
            done.set()

        threading.Thread(target=second, daemon=True).start()
        assert done.wait(10), "a search waited for another one to finish"
        assert got == ["k4"]
    finally:
        release.set()
        first.join(10)
    index.close()


def test_a_filter_on_many_unknown_keys_asks_the_store_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28, 2.3: 32 unknown keys looked every key up once per key (32 scans of all
    metadata; 16 s on PostgreSQL). The check is one lookup, whatever the number of keys."""
    with VectorIndex(tmp_path / "i.db") as index:
        index.bind_model(STAMP)
        index.store.upsert([ItemRow(key="a", vector=unit(1), metadata={"tag": 1})], dim=DIM)
        calls: list[list[str]] = []
        real = index.store.metadata_keys_present

        def counted(keys: Sequence[str]) -> set[str]:
            calls.append(list(keys))
            return real(keys)

        monkeypatch.setattr(index.store, "metadata_keys_present", counted)
        with pytest.raises(MetadataError, match="missing00"):
            index.search(unit(1), 1, where=with_filters({f"missing{j:02d}": j for j in range(32)}))
        assert len(calls) == 1 and len(calls[0]) == 32


def test_migration_to_v6_indexes_dates_and_places_and_a_read_only_open_migrates(
    tmp_path: Path,
) -> None:
    from themis_clip.index.where import parse_where

    path = tmp_path / "i.db"
    with SQLiteStore(path) as store:
        store.upsert(
            [
                ItemRow(key="a", vector=unit(1), metadata={"taken": "2023-07-14T18:03:11+02:00"}),
                ItemRow(key="b", vector=unit(2), metadata={"gps": {"lat": -33.9, "lon": 151.2}}),
            ],
            dim=DIM,
        )
    db = sqlite3.connect(path)  # back to what version 5 wrote: no expression indexes
    for name in ("items_taken", "items_gps", "items_camera"):
        db.execute(f"DROP INDEX {name}")
    db.execute("PRAGMA user_version = 5")
    db.commit()
    db.close()
    with SQLiteStore(path, readonly=True) as store:  # a writable file: migrated, then read
        (version,) = store._db.execute("PRAGMA user_version").fetchone()
        assert version == SCHEMA_VERSION
        taken = parse_where({"taken": {"$gte": "2023-07-14T16:00:00Z"}})
        assert {store.items_by_id([i])[i].key for i in store.ids_where(taken)} == {"a"}
        plan = store._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'items_%'"
        ).fetchall()
        assert {"items_taken", "items_gps", "items_camera"} <= {r[0] for r in plan}
    db = sqlite3.connect(path)  # a row of malformed JSON (another tool's) matches nothing
    db.execute("UPDATE items SET metadata = '{not json' WHERE key = 'b'")
    db.commit()
    db.close()
    with SQLiteStore(path, readonly=True) as store:
        near = parse_where({"gps": {"$near": {"lat": -33.9, "lon": 151.2, "km": 5}}})
        assert store.ids_where(near) == set()
        assert len(store.ids_where(parse_where({"x": {"$ne": 1}}))) == 2
        assert len(store.ids_where(taken)) == 1


def test_a_read_only_open_of_an_older_file_it_cannot_write_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "i.db"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 5")
    db.commit()
    db.close()
    # Not writable for this process: asked of the OS, whose answer is faked here, since root
    # (as CI runs) may write any file whatever its mode.
    monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
    with pytest.raises(SearchIndexError, match="needs a migration; open it writable once"):
        SQLiteStore(path, readonly=True)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (5,)  # untouched


def test_writing_to_a_read_only_index_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from themis_clip.errors import SearchIndexError
    from themis_clip.index.stores.sqlite import store

    path = tmp_path / "i.db"
    store.SQLiteStore(path).close()
    monkeypatch.setattr(store.os, "access", lambda p, mode: not (mode & store.os.W_OK))
    with pytest.raises(SearchIndexError, match="read-only .* copy it somewhere writable"):
        store.SQLiteStore(path)
    store.SQLiteStore(path, readonly=True).close()  # searching it still works


def test_a_full_disk_is_the_store_s_error_and_loses_nothing_written_before(tmp_path: Path) -> None:
    # SQLite's page limit stands in for a full disk: the same SQLITE_FULL error.
    with SQLiteStore(tmp_path / "i.db") as store:
        store.upsert([ItemRow(key="a", vector=unit(1))], dim=DIM)
        (pages,) = store._db.execute("PRAGMA page_count").fetchone()
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        big = [ItemRow(key=f"k{i}", vector=unit(i), thumbnail=b"x" * 50_000) for i in range(9)]
        with pytest.raises(SearchIndexError, match=r"cannot write index .*i\.db: .*full"):
            store.upsert(big, dim=DIM)
        assert store.count() == 1 and store.integrity_ok()
        store._db.execute("PRAGMA max_page_count = 1073741823")
        store.upsert(big[:1], dim=DIM)  # the connection is usable once there is room
        assert store.count() == 2 and store.get("k0") is not None
