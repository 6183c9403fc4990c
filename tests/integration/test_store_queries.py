"""The store contract's part for queries beyond one vector (lexical search, paging, browsing),
on both stores: SQLite and both PostgreSQL builds."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from tests.fakes import STAMP, unit
from themis_clip import InputError, MetadataError
from themis_clip.index.query import QueryMode, search_page
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.index.where import parse_where, with_filters

DIM = 16


def photos(n: int = 40) -> list[ItemRow]:
    return [
        ItemRow(
            key=f"/photos/IMG_{4700 + i}.jpg",
            path=f"/photos/IMG_{4700 + i}.jpg",
            vector=unit(i),
            metadata={
                "caption": "a red sailing boat" if i == 7 else f"picture {i}",
                "group": i % 3,
                "place": {"city": "Lisbon"} if i == 9 else None,
            },
        )
        for i in range(n)
    ]


def words(index: VectorIndex, text: str, filters: dict[str, object] | None = None) -> list[str]:
    ids = index.store.lexical(text, 50, with_filters(filters))
    items = index.store.items_by_id(ids)
    return [items[i].key for i in ids]


def test_lexical_finds_file_names_captions_and_nested_strings(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(photos(), dim=DIM)
        assert words(index, "IMG_4711") == ["/photos/IMG_4711.jpg"]
        assert words(index, "img_4711.JPG") == ["/photos/IMG_4711.jpg"]
        assert words(index, "boat") == ["/photos/IMG_4707.jpg"]
        assert words(index, "red boat") == ["/photos/IMG_4707.jpg"]  # every word required
        assert words(index, "red lorry") == []
        assert words(index, "Lisbon") == ["/photos/IMG_4709.jpg"]  # a nested string value
        assert words(index, "boat", {"group": 1}) == ["/photos/IMG_4707.jpg"]
        assert words(index, "boat", {"group": 0}) == []
        # Query syntax is never interpreted: quotes, operators, SQL.
        for hostile in ['"', "*", "boat OR", "NEAR(a b)", "'); DROP TABLE items; --", "-:^"]:
            assert isinstance(words(index, hostile), list)
        assert index.store.count() == 40
        # Writers keep it current: replace, rename, delete.
        index.store.upsert(
            [ItemRow(key="/photos/IMG_4707.jpg", vector=unit(7), metadata={"caption": "a dog"})],
            dim=DIM,
        )
        assert words(index, "boat") == [] and words(index, "dog") == ["/photos/IMG_4707.jpg"]
        index.store.rename(
            "/photos/IMG_4711.jpg",
            "/photos/holiday.jpg",
            path="/photos/holiday.jpg",
            size=1,
            mtime_ns=1,
        )
        assert words(index, "IMG_4711") == [] and words(index, "holiday") == ["/photos/holiday.jpg"]
        index.store.delete_keys(["/photos/holiday.jpg"])
        assert words(index, "holiday") == []


def test_lexical_index_is_backfilled_on_migration(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(photos(5), dim=DIM)
    if location.startswith("postgresql"):  # back to schema v1: no lexical column
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("ALTER TABLE themis_items DROP COLUMN lexical")
            conn.execute("UPDATE themis_meta SET value = '1' WHERE key = 'schema_version'")
    else:  # back to schema v5: no FTS table, no triggers
        db = sqlite3.connect(location)
        for name in ("items_lexical_insert", "items_lexical_update", "items_lexical_delete"):
            db.execute(f"DROP TRIGGER {name}")
        db.execute("DROP TABLE lexical")
        db.execute("PRAGMA user_version = 5")
        db.commit()
        db.close()
    with VectorIndex(location) as index:
        assert words(index, "IMG_4703") == ["/photos/IMG_4703.jpg"]


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "graph"])
def test_pages_concatenated_equal_one_query(location: str, graph: bool) -> None:
    many = [
        ItemRow(key=f"k{i:04d}", vector=unit(i), metadata={"g": i % 2, "w": f"w{i % 5}"})
        for i in range(600)
    ]
    threshold = 50 if graph else 10**6
    with VectorIndex(location, exact_threshold=threshold) as index:
        index.bind_model(STAMP)
        index.store.upsert(many, dim=DIM)
        if graph:  # SQLite: our HNSW graph; PostgreSQL: pgvector's
            index.prepare_graph()
            assert index.mode != "exact"
        q = unit("query")
        for filters in (None, {"g": 1}):
            for mode in (QueryMode.VECTOR, QueryMode.HYBRID):
                kw = {
                    "mode": mode,
                    "identity": {"q": 1},
                    "vector": q,
                    "where": with_filters(filters),
                }
                if mode == QueryMode.HYBRID:
                    kw["text"] = "w3"  # a fifth of the items: fused with the vector ranks
                whole = search_page(index, k=3 * 17, **kw)  # type: ignore[arg-type]
                pages, cursor = [], None
                for _ in range(3):
                    page = search_page(index, k=17, cursor=cursor, **kw)  # type: ignore[arg-type]
                    pages += page.hits
                    cursor = page.next
                assert [h.key for h in pages] == [h.key for h in whole.hits]
                assert len({h.key for h in pages}) == 51 and cursor is not None
                if filters:
                    assert all(h.metadata["g"] == 1 for h in pages)  # type: ignore[index]
                if mode == QueryMode.HYBRID:
                    assert sum(h.metadata["w"] == "w3" for h in pages[:10]) >= 5  # type: ignore[index]

        # Past the first windows too: pages cut across the 100 and 200 boundaries equal one
        # query (hybrid's fusion depends on the lists' lengths even on an exact search).
        for mode in (QueryMode.VECTOR, QueryMode.HYBRID):
            kw = {"mode": mode, "identity": {}, "vector": q, "text": "w3"}
            whole = search_page(index, k=330, **kw)  # type: ignore[arg-type]
            pages, cursor = [], None
            for size in (90, 60, 70, 110):
                page = search_page(index, k=size, cursor=cursor, **kw)  # type: ignore[arg-type]
                pages += page.hits
                cursor = page.next
            assert [h.key for h in pages] == [h.key for h in whole.hits]
            assert len({h.key for h in pages}) == 330 and cursor is not None


def test_a_page_reads_the_records_of_its_own_hits_only(
    location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of 10 ranks a window of 100 results by key and score, then reads the records
    (path, metadata, OCR) of its own 10: reading the whole window's was most of the cost of a
    search page at 100k items. The records read are the hits' own, in the ranking's order."""
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(photos(300), dim=DIM)
        asked: list[int] = []
        read = index.store.items_by_id
        monkeypatch.setattr(index.store, "items_by_id", lambda ids: asked.extend(ids) or read(ids))
        q = unit(5)
        hits = []
        for mode in (QueryMode.VECTOR, QueryMode.HYBRID, QueryMode.LEXICAL, QueryMode.BROWSE):
            asked.clear()
            kw = {"mode": mode, "identity": {}, "vector": q, "text": "picture"}
            first = search_page(index, k=10, **kw)  # type: ignore[arg-type]
            assert len(asked) == 10 and len(first.hits) == 10, mode
            asked.clear()
            second = search_page(index, k=10, cursor=first.next, **kw)  # type: ignore[arg-type]
            assert len(asked) == 10 and len(second.hits) == 10, mode
            hits += first.hits + second.hits
        monkeypatch.undo()
        for hit in hits:
            item = index.store.get(hit.key)
            assert item is not None and (hit.path, hit.metadata) == (item.path, item.metadata)
        ranked = index.search(q, 20)
        got = search_page(index, mode=QueryMode.VECTOR, k=20, identity={}, vector=q).hits
        assert got == ranked  # the same hits, records and scores as one search


def test_last_page_has_no_next_and_cursors_are_checked(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(photos(10), dim=DIM)
        kw = {"mode": QueryMode.VECTOR, "identity": {"q": 1}, "vector": unit(3)}
        first = search_page(index, k=6, **kw)  # type: ignore[arg-type]
        last = search_page(index, k=6, cursor=first.next, **kw)  # type: ignore[arg-type]
        assert len(first.hits) == 6 and len(last.hits) == 4 and last.next is None
        assert first.next is not None
        exact = search_page(index, k=10, **kw)  # type: ignore[arg-type]
        assert exact.next is None
        for forged in ("", "x", first.next[:-2], first.next[:-1] + "A", "A" * 64, "é" * 10):
            if forged == first.next:
                continue
            with pytest.raises(InputError, match="cursor"):
                search_page(index, k=6, cursor=forged, **kw)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="another query"):
            search_page(index, k=6, cursor=first.next, **{**kw, "identity": {"q": 2}})  # type: ignore[arg-type]
        with pytest.raises(InputError, match="another query"):
            search_page(index, k=6, cursor=first.next, **{**kw, "where": {"group": 1}})  # type: ignore[arg-type]
        # An item inserted above the cursor's last one: the next page still repeats nothing.
        index.store.upsert([ItemRow(key="new", vector=unit(3))], dim=DIM)
        again = search_page(index, k=6, cursor=first.next, **kw)  # type: ignore[arg-type]
        seen = {h.key for h in first.hits}
        assert not seen & {h.key for h in again.hits} and len(again.hits) == 4


def test_lexical_mode_and_browse_newest_first(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(
            [
                ItemRow(
                    key="old-taken",
                    vector=unit(1),
                    mtime_ns=9 * 10**18,
                    metadata={"taken": "2001-01-01T00:00:00", "mtime": 2_000_000_000},
                ),
                ItemRow(key="new-taken", vector=unit(2), metadata={"taken": "2024:05:01 12:00:00"}),
                ItemRow(key="mtime-2010", vector=unit(3), metadata={"mtime": 1_262_304_000}),
                ItemRow(key="file-2015", vector=unit(4), mtime_ns=1_420_070_400 * 10**9),
                ItemRow(key="none-first", vector=unit(5)),
                ItemRow(key="none-second", vector=unit(6), metadata={"taken": "not a date"}),
            ],
            dim=DIM,
        )
        browse = search_page(index, mode=QueryMode.BROWSE, k=4, identity={})
        rest = search_page(index, mode=QueryMode.BROWSE, k=4, identity={}, cursor=browse.next)
        assert [h.key for h in browse.hits + rest.hits] == [
            "new-taken",
            "file-2015",
            "mtime-2010",
            "old-taken",
            "none-second",
            "none-first",
        ]
        assert rest.next is None
        lexical = search_page(index, mode=QueryMode.LEXICAL, k=5, identity={}, text="taken")
        assert [h.key for h in lexical.hits] == ["new-taken", "old-taken"] or [
            h.key for h in lexical.hits
        ] == ["old-taken", "new-taken"]
        with pytest.raises(MetadataError, match="no item"):
            search_page(
                index, mode=QueryMode.BROWSE, k=4, identity={}, where=with_filters({"nope": 1})
            )
        with pytest.raises(InputError, match="text part"):
            search_page(index, mode=QueryMode.LEXICAL, k=4, identity={}, text="  ")
        assert np.isfinite([h.score for h in lexical.hits]).all()


def test_lexical_search_and_the_timeline_filter_in_the_store(location: str) -> None:
    # The filter narrows the query itself: the 5 best matches among k25..k29, not the 5 best
    # matches of all 30 with the filter applied after them (which would leave none).
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(
            [
                ItemRow(key=f"k{i:02d}", vector=unit(i), metadata={"caption": "boat", "n": i})
                for i in range(30)
            ],
            dim=DIM,
        )
        late = parse_where({"n": {"$gte": 25}})
        found = index.store.items_by_id(index.store.lexical("boat", 5, late))
        assert sorted(item.key for item in found.values()) == [f"k{i}" for i in range(25, 30)]
        early = with_filters({"caption": "boat"}, {"n": {"$lt": 3}})
        assert sorted(row[0] for row in index.store.timeline(early)) == sorted(
            index.store.ids_where(early)
        )
        assert len(index.store.timeline(early)) == 3
