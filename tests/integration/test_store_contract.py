"""One behavioural suite, run on both stores: SQLite (a file) and PostgreSQL + pgvector (a real
server started by the tests, ``tests/pg.py``; those cases carry the ``postgres`` marker)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import STAMP, FakeEmbedder, unit, write_png
from themis_clip import IndexModelMismatchError, MetadataError, SearchIndexError
from themis_clip.errors import WhereError
from themis_clip.index.indexer import index_folder
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow, open_store
from themis_clip.index.where import parse_where, with_filters
from themis_clip.vocabulary import ModelIdentity

DIM = 16


def rows(n: int, start: int = 0, **meta: object) -> list[ItemRow]:
    return [
        ItemRow(key=f"k{i}", vector=unit(i), metadata={"n": i, "even": i % 2 == 0, **meta})
        for i in range(start, start + n)
    ]


def test_items_round_trip_exactly(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        store = index.store
        thumb = b"\xff\xd8 jpeg bytes \x00"
        store.upsert(
            [
                ItemRow(
                    key="a/b%_c",
                    vector=unit(1),
                    path="/p/a.png",
                    size=10,
                    mtime_ns=2**62,
                    sha256="ab" * 32,
                    metadata={"tag": "x", "nested": {"l": [1, 2.5, None, True]}, "nul": "a\x00b"},
                    thumbnail=thumb,
                ),
                ItemRow(key="b", vector=unit(2)),
            ],
            dim=DIM,
        )
        got = store.get("a/b%_c")
        assert got is not None and got.path == "/p/a.png" and got.size == 10
        assert got.mtime_ns == 2**62 and got.sha256 == "ab" * 32
        assert got.metadata == {"tag": "x", "nested": {"l": [1, 2.5, None, True]}, "nul": "a\x00b"}
        assert store.thumbnail("a/b%_c") == thumb and store.thumbnail("b") is None
        assert np.array_equal(store.vector("b"), unit(2))  # float32, bit for bit
        assert store.vector("missing") is None and store.get("missing") is None
        assert store.count() == 2
        ids, matrix = store.load_vectors(DIM)
        assert list(ids) == sorted(ids) and np.array_equal(matrix[1], unit(2))
        # Same key again: replaced in place (same id), not duplicated.
        before = store.get("b")
        store.upsert([ItemRow(key="b", vector=unit(3), metadata={"v": 2})], dim=DIM)
        after = store.get("b")
        assert before and after and after.id == before.id and after.metadata == {"v": 2}
        assert np.array_equal(store.vector("b"), unit(3)) and store.count() == 2
        assert store.keys_by_id() == {got.id: "a/b%_c", after.id: "b"}


def test_bad_rows_are_refused_whole(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        good = ItemRow(key="ok", vector=unit(1))
        with pytest.raises(SearchIndexError, match="vector shape"):
            index.store.upsert([good, ItemRow(key="c", vector=np.zeros(3, np.float32))], dim=DIM)
        nan = unit(2).copy()
        nan[0] = np.nan
        with pytest.raises(SearchIndexError, match="NaN"):
            index.store.upsert([good, ItemRow(key="n", vector=nan)], dim=DIM)
        with pytest.raises(MetadataError, match="NaN"):
            index.store.upsert(
                [good, ItemRow(key="m", vector=unit(3), metadata={"x": np.nan})], dim=DIM
            )
        assert index.store.count() == 0  # nothing half-written


def test_writes_are_versioned_and_tracked(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        store = index.store
        v0 = store.write_version
        store.upsert(rows(5), dim=DIM)
        v1 = store.write_version
        assert v1 > v0
        store.upsert([ItemRow(key="k1", vector=unit(100))], dim=DIM)
        assert store.delete_keys(["k2", "nope"]) == 1
        changed, vectors, removed = store.changes_since(v1, DIM)
        k1 = store.get("k1")
        assert k1 is not None and changed.tolist() == [k1.id]
        assert np.array_equal(vectors[0], unit(100)) and len(removed) == 1
        assert store.changes_since(store.write_version, DIM)[0].size == 0
        assert store.vectors_by_id([k1.id, 10**9], DIM)[1].tolist() == [0.0] * DIM


def test_folders_renames_duplicates_and_failures(location: str, tmp_path: Path) -> None:
    folder = tmp_path / "photos_%"  # LIKE wildcards in the folder name are literal
    sibling = tmp_path / "photos_%x"
    for i in range(4):
        write_png(folder / f"{i}.png", i)
    write_png(sibling / "s.png", 50)
    (folder / "broken.jpg").write_bytes(b"not an image")
    embedder = FakeEmbedder()
    with VectorIndex(location) as index:
        index_folder(index, sibling, embedder, stamp=STAMP, progress=False)
        r = index_folder(index, folder, embedder, stamp=STAMP, chunk=2, progress=False)
        assert r.added == 4 and [Path(p).name for p, _ in r.failed] == ["broken.jpg"]
        assert set(index.store.failures_under(str(folder.resolve()))) == {
            str((folder / "broken.jpg").resolve())
        }
        embedder.embedded.clear()
        os.rename(folder / "0.png", folder / "zero.png")
        (folder / "copy.png").write_bytes((folder / "1.png").read_bytes())
        (folder / "3.png").unlink()
        (folder / "broken.jpg").unlink()
        r = index_folder(index, folder, embedder, stamp=STAMP, progress=False)
        assert (r.renamed, r.duplicates, r.removed, r.unchanged) == (1, 1, 1, 2)
        assert embedder.embedded == [] and not index.store.failures_under(str(folder.resolve()))
        assert len(index.store.items_under(str(folder.resolve()))) == 4
        assert index.store.count() == 5  # the sibling folder untouched
        assert (
            len(
                index.store.by_sha256(
                    index.store.get(str((folder / "1.png").resolve())).sha256 or ""
                )
            )
            == 2
        )  # type: ignore[union-attr]


def test_copies_within_one_run_are_embedded_once(location: str, tmp_path: Path) -> None:
    """Byte-identical files new in the same run: one embedding, the others counted as the
    duplicates they are (a first run said "0 duplicates" and embedded each)."""
    folder = tmp_path / "photos"
    write_png(folder / "a.png", 1)
    write_png(folder / "other.png", 2)
    for name in ("b.png", "c.png"):
        (folder / name).write_bytes((folder / "a.png").read_bytes())
    (folder / "bad1.jpg").write_bytes(b"not an image")
    (folder / "bad2.jpg").write_bytes(b"not an image")
    embedder = FakeEmbedder()
    with VectorIndex(location) as index:
        r = index_folder(index, folder, embedder, stamp=STAMP, chunk=2, progress=False)
        assert (r.added, r.duplicates) == (2, 2)
        assert sorted(Path(p).name for p, _ in r.failed) == ["bad1.jpg", "bad2.jpg"]
        assert sorted(Path(p).name for p in embedder.embedded) == ["a.png", "bad1.jpg", "other.png"]
        vectors = [
            index.store.vector(str((folder / n).resolve())) for n in ("a.png", "b.png", "c.png")
        ]
        assert all(v is not None and np.array_equal(v, vectors[0]) for v in vectors)
        assert len(index.store.failures_under(str(folder.resolve()))) == 2


def test_an_interrupted_run_resumes_to_a_clean_run(location: str, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    for i in range(10):
        write_png(folder / f"{i:02d}.png", i)
    with VectorIndex(location) as index:
        with pytest.raises(KeyboardInterrupt):
            index_folder(
                index, folder, FakeEmbedder(crash_after=4), stamp=STAMP, chunk=4, progress=False
            )
        assert index.store.count() == 4  # the committed chunk survived, nothing partial
        resumed = FakeEmbedder()
        r = index_folder(index, folder, resumed, stamp=STAMP, chunk=4, progress=False)
        assert r.unchanged == 4 and r.added == 6 and len(resumed.embedded) == 6
        _, got = index.store.load_vectors(DIM)
    with VectorIndex(tmp_path / "clean.db") as clean:
        index_folder(clean, folder, FakeEmbedder(), stamp=STAMP, progress=False)
        _, want = clean.store.load_vectors(DIM)
    assert np.array_equal(np.sort(got, axis=0), np.sort(want, axis=0))


def test_model_identity_is_recorded_and_enforced(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
    with VectorIndex(location) as index:
        assert index.stamp == STAMP
        index.bind_model(STAMP)
        with pytest.raises(IndexModelMismatchError, match="Re-index"):
            index.bind_model(ModelIdentity.from_model_id("other@1", sha256="cd" * 32, dim=DIM))
        with pytest.raises(IndexModelMismatchError, match="3 dimensions"):
            index.search(np.ones(3, np.float32), 1)


def test_search_matches_brute_force_with_filters(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows(300), dim=DIM)
        data = np.stack([unit(i) for i in range(300)])
        q = unit(7)
        hits = index.search(q, 10)
        want = np.argsort(-(data @ q))[:10]
        assert [int(h.key[1:]) for h in hits][:1] == [7]
        assert len({int(h.key[1:]) for h in hits} & set(want.tolist())) >= 9
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        even = index.search(q, 5, where=with_filters({"even": False}))
        want_odd = [i for i in np.argsort(-(data @ q)) if i % 2][:5]
        assert [int(h.key[1:]) for h in even] == [int(i) for i in want_odd]
        assert all(h.metadata and h.metadata["even"] is False for h in even)
        like = index.search_like("k42", 3)
        assert like[0].key == "k42"
        with pytest.raises(KeyError):
            index.search_like("nope", 3)
        with pytest.raises(MetadataError, match="no item in this index has the metadata key"):
            index.search(q, 5, where=with_filters({"colour": "red"}))


def test_filters_use_json_equality(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        values = [1, 1.0, True, "1", None, [1, 2], [1], {"a": 1}, "a\x00b", 0, False]
        index.store.upsert(
            [ItemRow(key=f"v{i}", vector=unit(i), metadata={"x": v}) for i, v in enumerate(values)],
            dim=DIM,
        )

        def keys(value: object) -> set[str]:
            ids = index.store.ids_where(with_filters({"x": value}))
            return {item.key for item in index.store.items_by_id(list(ids)).values()}

        assert keys(1) == {"v0", "v1"}  # 1 and 1.0 are one JSON number
        assert keys(True) == {"v2"} and keys("1") == {"v3"} and keys(None) == {"v4"}
        assert keys([1, 2]) == {"v5"} and keys([1]) == {"v6"}  # equality, not containment
        assert keys({"a": 1}) == {"v7"} and keys("a\x00b") == {"v8"}
        assert keys(0) == {"v9"} and keys(False) == {"v10"}


def test_nested_filters_treat_1_and_1_0_as_one_number(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        values = [[1, 2], [1.0, 2.0], {"a": 1, "b": [True]}, {"b": [True], "a": 1.0}, [True, 2]]
        index.store.upsert(
            [ItemRow(key=f"v{i}", vector=unit(i), metadata={"x": v}) for i, v in enumerate(values)],
            dim=DIM,
        )

        def keys(value: object) -> set[str]:
            ids = index.store.ids_where(with_filters({"x": value}))
            return {item.key for item in index.store.items_by_id(list(ids)).values()}

        assert keys([1, 2]) == {"v0", "v1"} and keys([1.0, 2]) == {"v0", "v1"}  # as at the top
        assert keys({"a": 1.0, "b": [True]}) == {"v2", "v3"}  # key order is no difference
        assert keys([1, 2.5]) == set() and keys([True, 2]) == {"v4"}  # true is still not 1
        assert keys([2, 1]) == set()  # order within an array is


def test_facets_count_keys_and_values(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(
            [
                ItemRow(key=f"i{i}", vector=unit(i), metadata={"camera": "x" if i < 3 else "y"})
                for i in range(5)
            ]
            + [ItemRow(key="t", vector=unit(9), metadata={"trip": True, "camera": "x"})],
            dim=DIM,
        )
        facets = {f["key"]: f for f in index.store.metadata_facets()}
        assert facets["camera"]["count"] == 6 and facets["trip"]["count"] == 1
        assert facets["camera"]["values"] == [
            {"value": "x", "count": 4},
            {"value": "y", "count": 2},
        ]
        assert facets["trip"]["values"] == [{"value": True, "count": 1}]
        assert index.store.metadata_keys_present(["camera", "lens"]) == {"camera"}


def test_read_only_opens(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows(3), dim=DIM)
    with VectorIndex(location, readonly=True) as ro:
        assert ro.search(unit(1), 1)[0].key == "k1"
        with pytest.raises(SearchIndexError):
            ro.store.upsert(rows(1, start=10), dim=DIM)
    with VectorIndex(location) as rw:
        assert rw.store.count() == 3


def test_two_openers_see_each_others_writes(location: str) -> None:
    with VectorIndex(location) as a, VectorIndex(location) as b:
        a.bind_model(STAMP)
        a.store.upsert(rows(20), dim=DIM)
        assert b.search(unit(5), 1)[0].key == "k5"
        b.store.upsert([ItemRow(key="from-b", vector=unit(1000))], dim=DIM)
        a.store.delete_keys(["k5"])
        assert a.search(unit(1000), 1)[0].key == "from-b"
        assert b.search(unit(5), 1)[0].key != "k5"


def test_concurrent_writers_lose_nothing(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            with VectorIndex(location) as mine:
                for batch in range(5):
                    mine.store.upsert(rows(10, start=w * 1000 + batch * 10), dim=DIM)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    with VectorIndex(location) as index:
        assert index.store.count() == 150


def test_a_newer_schema_is_refused(location: str) -> None:
    VectorIndex(location).close()
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("UPDATE themis_meta SET value = '99' WHERE key = 'schema_version'")
    else:
        import sqlite3

        db = sqlite3.connect(location)
        db.execute("PRAGMA user_version = 99")
        db.close()
    with pytest.raises(SearchIndexError, match="newer than this themis-clip supports"):
        open_store(location)


def test_remove_deletes_the_index(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows(3), dim=DIM)
    VectorIndex.remove(location)
    with VectorIndex(location) as index:
        assert index.store.count() == 0 and index.stamp is None


# -- the where language (themis_clip.index.where) ------------------------------------------------

PHOTOS: dict[str, dict[str, object]] = {
    "paris": {
        "taken": "2023-07-14T18:03:11+02:00",  # 16:03:11 UTC
        "camera": {"make": "Canon", "model": "EOS R5"},
        "gps": {"lat": 48.8584, "lon": 2.2945},
        "n": 1,
    },
    "versailles": {
        "taken": "2023-07-14T16:03:11Z",  # the same instant as paris
        "camera": {"make": "Canon", "model": "EOS R6"},
        "gps": {"lat": 48.8049, "lon": 2.1204},
        "n": 1.0,
    },
    "sydney": {
        "taken": "2023-07-15T09:00:00",  # no offset: UTC
        "camera": {"make": "NIKON", "model": "Z 6"},
        "gps": {"lat": -33.8568, "lon": 151.2153},
        "n": 2,
    },
    "rio": {
        "taken": "2023-07-15",  # a date: that day's start
        "camera": {"make": "Apple"},
        "gps": {"lat": -22.9519, "lon": -43.2105},  # south and west
        "n": True,
    },
    "fiji": {"gps": {"lat": -17.7, "lon": 179.9}, "n": "2", "taken": "not a date"},
    "samoa": {"gps": {"lat": -13.8, "lon": -171.8}, "odd'key; DROP TABLE items; --": "x"},
    "bare": {},
}


def _where_index(location: str) -> VectorIndex:
    index = VectorIndex(location)
    index.bind_model(STAMP)
    index.store.upsert(
        [
            ItemRow(key=k, vector=unit(i), metadata=m or None)
            for i, (k, m) in enumerate(PHOTOS.items())
        ],
        dim=DIM,
    )
    return index


def test_where_operators_nested_paths_dates_and_geo(location: str) -> None:
    with _where_index(location) as index:

        def keys(where: dict[str, object]) -> set[str]:
            ids = index.store.ids_where(parse_where(where))
            return {item.key for item in index.store.items_by_id(list(ids)).values()}

        assert keys({"camera.make": "Canon"}) == {"paris", "versailles"}
        assert keys({"camera.make": {"$eq": "Canon"}, "camera.model": "EOS R6"}) == {"versailles"}
        assert keys({"camera.make": {"$ne": "Canon"}}) == set(PHOTOS) - {"paris", "versailles"}
        assert keys({"camera.make": {"$in": ["Apple", "NIKON"]}}) == {"rio", "sydney"}
        assert keys({"camera.make": {"$nin": ["Apple", "Canon"]}}) == {
            "sydney",
            "fiji",
            "samoa",
            "bare",
        }
        assert keys({"camera.model": {"$exists": True}}) == {"paris", "versailles", "sydney"}
        assert keys({"camera": {"$exists": False}}) == {"fiji", "samoa", "bare"}
        # Numbers: 1 and 1.0 are one, true is not 1, "2" is not 2.
        assert keys({"n": 1}) == {"paris", "versailles"}
        assert keys({"n": {"$gte": 1.5}}) == {"sydney"}
        assert keys({"n": {"$lt": 2}}) == {"paris", "versailles"}
        assert keys({"n": True}) == {"rio"} and keys({"n": "2"}) == {"fiji"}
        # Dates as instants: offsets honoured, no offset is UTC, a date is the day's start.
        assert keys({"taken": "2023-07-14T16:03:11+00:00"}) == {"paris", "versailles"}
        assert keys({"taken": {"$gt": "2023-07-14T16:03:11Z"}}) == {"sydney", "rio"}
        assert keys({"taken": {"$gte": "2023-07-15"}}) == {"sydney", "rio"}
        assert keys({"taken": {"$lt": "2023-07-15T00:00:00"}}) == {"paris", "versailles"}
        assert keys({"taken": {"$lte": "2023-07-15T02:00:00+02:00"}}) == {
            "paris",
            "versailles",
            "rio",
        }
        assert keys({"taken": {"$gte": "2023-07-14", "$lt": "2023-07-15"}}) == {
            "paris",
            "versailles",
        }
        # Logic.
        assert keys({"$or": [{"n": 2}, {"camera.make": "Apple"}]}) == {"sydney", "rio"}
        assert keys({"$and": [{"n": 1}, {"camera.model": "EOS R5"}]}) == {"paris"}
        assert keys({"$not": {"camera.make": "Canon"}}) == set(PHOTOS) - {"paris", "versailles"}
        assert keys({"n": {"$not": {"$gte": 1.5}}}) == set(PHOTOS) - {"sydney"}
        # Geo: great-circle radius, south and west negative, across the antimeridian.
        near_paris = {"gps": {"$near": {"lat": 48.86, "lon": 2.34, "km": 50}}}
        assert keys(near_paris) == {"paris", "versailles"}
        assert keys({"gps": {"$near": {"lat": 48.86, "lon": 2.34, "km": 10}}}) == {"paris"}
        assert keys({"gps": {"$near": {"lat": -22.9, "lon": -43.2, "km": 20}}}) == {"rio"}
        assert keys({"gps": {"$near": {"lat": -17.7, "lon": -179.9, "km": 30}}}) == {"fiji"}
        assert keys({"gps": {"$near": {"lat": -15, "lon": 180, "km": 1000}}}) == {"fiji", "samoa"}
        assert keys({"gps.lat": {"$lt": 0}}) == {"sydney", "rio", "fiji", "samoa"}
        # And in a search, with the equality filters.
        hits = index.search(unit(0), 5, where=near_paris)
        assert {h.key for h in hits} == {"paris", "versailles"} and hits[0].key == "paris"
        hits = index.search(unit(0), 5, where=with_filters({"n": 1}, {"camera.model": "EOS R6"}))
        assert [h.key for h in hits] == ["versailles"]


def test_where_dates_before_year_1000_and_before_1970(location: str) -> None:
    # A bound is compared as an instant on every store: a year under 1000 keeps its four
    # digits, and a fraction of a second before 1970 counts back from the epoch, not toward it.
    taken = {
        "year1": "0001-01-01",
        "y999": "0999-12-31T23:59:59Z",
        "before_epoch": "1969-12-31T23:59:59.250Z",
        "epoch": "1970-01-01T00:00:00Z",
        "now": "2023-07-14",
    }
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(
            [
                ItemRow(key=k, vector=unit(i), metadata={"taken": t})
                for i, (k, t) in enumerate(taken.items())
            ],
            dim=DIM,
        )

        def keys(where: dict[str, object]) -> set[str]:
            ids = index.store.ids_where(parse_where(where))
            return {item.key for item in index.store.items_by_id(list(ids)).values()}

        assert keys({"taken": {"$gte": "0001-01-01"}}) == set(taken)
        assert keys({"taken": "0001-01-01T00:00:00Z"}) == {"year1"}
        assert keys({"taken": {"$lt": "1000-01-01"}}) == {"year1", "y999"}
        assert keys({"taken": {"$gt": "0500-06-01", "$lt": "1970-01-01"}}) == {
            "y999",
            "before_epoch",
        }
        assert keys({"taken": {"$gt": "1969-12-31T23:59:59.5Z"}}) == {"epoch", "now"}
        assert keys({"taken": {"$lte": "1969-12-31T23:59:59.25Z"}}) == {
            "year1",
            "y999",
            "before_epoch",
        }


def test_where_values_and_keys_never_become_sql(location: str) -> None:
    with _where_index(location) as index:

        def keys(where: dict[str, object]) -> set[str]:
            ids = index.store.ids_where(parse_where(where))
            return {item.key for item in index.store.items_by_id(list(ids)).values()}

        evil = "odd'key; DROP TABLE items; --"
        assert keys({evil: "x"}) == {"samoa"}
        assert keys({evil: {"$exists": True}}) == {"samoa"}
        assert keys({"camera.make": "x' OR '1'='1"}) == set()
        assert keys({"camera.make": {"$in": ["'); DROP TABLE themis_items; --", "Canon"]}}) == {
            "paris",
            "versailles",
        }
        assert (
            keys({"[0]": 1}) == set()
            and keys({"gps.$[0]": 1}) == set()
            and keys({"a*": {"$exists": True}}) == set()
        )
        assert keys({"camera.make%": {"$exists": True}}) == set()
        assert index.store.count() == len(PHOTOS)  # nothing was dropped


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ({"n": {"$regex": "x"}}, "where.n.$regex"),
        ({"$nor": []}, "where.$nor"),
        ({"n": {"$gt": "soon"}}, "where.n.$gt"),
        ({"taken": {"$gte": "2023-13-40"}}, "where.taken.$gte"),
        ({"n": {"$in": 3}}, "where.n.$in"),
        ({"n": {"$exists": 1}}, "where.n.$exists"),
        ({"$or": [{"n": 1}, {"m": {"$lt": [1]}}]}, "where.$or[1].m.$lt"),
        ({"gps": {"$near": {"lat": 91, "lon": 0, "km": 1}}}, "where.gps.$near.lat"),
        ({"gps": {"$near": {"lat": 0, "lon": 0}}}, "where.gps.$near"),
        ({"n": {"$in": list(range(300))}}, "where.n.$in"),
        ({"a..b": 1}, "where.a..b"),
        ({"$and": [{"n": 1}] * 70}, "where.$and"),
        ({"$has_text": "yes"}, "where.$has_text"),
        ({"$not": {"$has_text": None}}, "where.$not.$has_text"),
    ],
)
def test_bad_where_filters_name_their_path(where: dict[str, object], path: str) -> None:
    with pytest.raises(WhereError) as caught:
        parse_where(where)
    assert caught.value.path.startswith(path), caught.value
    assert isinstance(caught.value, MetadataError)  # a 422 over HTTP


def test_exif_metadata_arrives_on_the_next_run_without_re_embedding(
    location: str, tmp_path: Path
) -> None:
    folder = tmp_path / "photos"
    for i in range(3):
        write_png(folder / f"p{i}.png", i)
    embedder = FakeEmbedder()
    with VectorIndex(location) as index:
        index_folder(index, folder, embedder, stamp=STAMP)  # an older run: no metadata reader
        index.store.upsert([ItemRow(key="http", vector=unit(9), metadata={"given": 1})], dim=DIM)
        vectors = {k: index.store.vector(str(folder / f"p{k}.png")) for k in range(3)}

        def read(path: Path) -> dict[str, object]:
            n = int(path.stem[1:])
            return {"taken": f"2023-07-1{n}T10:00:00", "camera": {"make": "Canon"}}

        report = index_folder(index, folder, embedder, stamp=STAMP, metadata=read)
        assert report.embedded == 0 and len(embedder.embedded) == 3  # nothing embedded again
        item = index.store.get(str(folder / "p2.png"))
        assert item and item.metadata is not None
        # the reader's keys, and the file facts every folder item gets (also added late)
        assert {k: item.metadata.get(k) for k in ("taken", "camera", "folder", "name")} == {
            "taken": "2023-07-12T10:00:00",
            "camera": {"make": "Canon"},
            "folder": ".",
            "name": "p2.png",
        }
        assert all(
            np.array_equal(index.store.vector(str(folder / f"p{k}.png")), v)
            for k, v in vectors.items()
        )
        assert index.store.get("http").metadata == {"given": 1}  # HTTP items keep theirs
        hits = index.search(unit(0), 5, where={"taken": {"$gte": "2023-07-11"}})
        assert {h.key for h in hits} == {str(folder / "p1.png"), str(folder / "p2.png")}
        write_png(folder / "p3.png", 3)  # a new file gets its metadata as it is embedded
        index_folder(index, folder, embedder, stamp=STAMP, metadata=read)
        assert index.store.get(str(folder / "p3.png")).metadata["taken"] == "2023-07-13T10:00:00"


@pytest.mark.parametrize(
    ("where", "index_name"),
    [
        ({"taken": {"$gte": "2023-07-15"}}, "taken"),
        ({"gps": {"$near": {"lat": 48.86, "lon": 2.34, "km": 50}}}, "gps"),
        ({"camera.make": "Canon"}, "camera"),
    ],
)
def test_where_on_taken_gps_and_camera_reads_an_index(
    location: str, where: dict[str, object], index_name: str
) -> None:
    from themis_clip.index.wheresql import compile_postgres, compile_sqlite

    with _where_index(location) as index:
        store = index.store
        if isinstance(location, str) and location.startswith("postgresql"):
            sql, params = compile_postgres(parse_where(where))
            with store.connection() as db, db.transaction():  # type: ignore[attr-defined]
                db.execute("SET LOCAL enable_seqscan = off")  # 7 rows: force the choice
                plan = db.execute(
                    f"EXPLAIN SELECT id FROM themis_items WHERE {sql}", params
                ).fetchall()
            assert f"themis_items_{index_name}" in str(plan)
        else:
            sql, params = compile_sqlite(parse_where(where))
            plan = (
                store._reader()  # type: ignore[attr-defined]
                .execute(f"EXPLAIN QUERY PLAN SELECT id FROM items WHERE {sql}", params)
                .fetchall()
            )
            assert f"USING INDEX items_{index_name}" in str(plan)


def test_photo_facets_give_the_date_range_and_the_makes(location: str) -> None:
    with _where_index(location) as index:
        facets = index.store.photo_facets()
        # By instant: paris and versailles are one instant; "not a date" is no date.
        assert facets["taken"]["first"] in ("2023-07-14T18:03:11+02:00", "2023-07-14T16:03:11Z")
        assert facets["taken"]["last"] == "2023-07-15T09:00:00"
        assert facets["makes"] == [
            {"make": "Canon", "count": 2},
            {"make": "Apple", "count": 1},
            {"make": "NIKON", "count": 1},
        ]
        index.store.delete_keys(list(PHOTOS))
        assert index.store.photo_facets() == {"taken": None, "makes": []}
