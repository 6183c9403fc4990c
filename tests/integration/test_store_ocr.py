"""The store contract's part for the text read in pictures (OCR), on both stores: readings
kept beside items, substring and tolerant lexical search over them, ``$has_text``, the
matched lines in results, and no cost for an index that never read any."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import STAMP, unit
from themis_clip import InputError, SearchIndexError
from themis_clip.index.indexer import IndexReport, read_texts
from themis_clip.index.query import QueryMode, search_page
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow, Lexical
from themis_clip.index.where import parse_where

DIM = 16
BOX = [[10.0, 20.0], [110.0, 20.0], [110.0, 50.0], [10.0, 50.0]]


def reading(*texts: str, gated: bool = False) -> dict[str, Any]:
    return {
        "width": 640,
        "height": 480,
        "gated": gated,
        "lines": [
            {"text": t, "box": [[x, y + 40 * i] for x, y in BOX], "confidence": 0.9}
            for i, t in enumerate(texts)
        ],
    }


def items(n: int = 8) -> list[ItemRow]:
    return [
        ItemRow(key=f"/p/{i}.jpg", path=f"/p/{i}.jpg", sha256=f"{i:064x}", vector=unit(i))
        for i in range(n)
    ]


READINGS = {
    "/p/0.jpg": reading("STARBUCKS COFFEE", "OPEN 7 DAYS"),
    "/p/1.jpg": reading("Total 12.50", "THANK YOU"),
    "/p/2.jpg": reading("STARBUGKS"),  # a misreading
    "/p/3.jpg": reading(gated=True),  # read, nothing found
}


def found(index: VectorIndex, text: str, where: dict[str, Any] | None = None) -> list[str]:
    ids = index.store.lexical(text, 50, parse_where(where) if where else None)
    got = index.store.items_by_id(ids)
    return [got[i].key for i in ids]


def test_ocr_text_is_found_by_substring_and_tolerantly(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(items(), dim=DIM)
        assert index.store.set_ocr(READINGS) == 4
        assert index.store.set_ocr({"/p/none.jpg": reading("X")}) == 0  # no such item
        assert found(index, "bucks") == ["/p/0.jpg"]  # a substring, any case
        assert found(index, "Starbucks coffee") == ["/p/0.jpg"]  # the misreading lacks coffee
        assert found(index, "thank total") == ["/p/1.jpg"]  # every word, any order
        assert found(index, "12.5") == ["/p/1.jpg"]
        assert found(index, "to") == ["/p/1.jpg"]  # under 3 characters: still a substring
        assert found(index, "ys") == ["/p/0.jpg"]
        assert found(index, "bucks tea") == []
        # Tolerant: a misreading comes after the exact match; the exact one comes first.
        assert found(index, "starbucks") == ["/p/0.jpg", "/p/2.jpg"]
        assert found(index, "starbugks")[0] == "/p/2.jpg"
        assert found(index, "bukcs") == []  # too far from any word
        # Filters apply to OCR matches too, $has_text among them.
        assert found(index, "starbucks", {"$has_text": True}) == ["/p/0.jpg", "/p/2.jpg"]
        assert found(index, "bucks", {"$not": {"$has_text": True}}) == []
        with_text = index.store.ids_where(parse_where({"$has_text": True}))
        assert sorted(index.store.items_by_id(list(with_text))[i].key for i in with_text) == [
            "/p/0.jpg",
            "/p/1.jpg",
            "/p/2.jpg",
        ]
        without = index.store.ids_where(parse_where({"$has_text": False}))
        assert len(without) == 5  # the gated one and the four never read
        # Query syntax is never interpreted.
        for hostile in ['"', "%", "_", "'); DROP TABLE items; --", "NEAR(a b)", "*"]:
            assert isinstance(found(index, hostile), list)
        assert index.store.count() == 8


def test_results_name_the_matched_lines_and_boxes(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(items(), dim=DIM)
        index.store.set_ocr(READINGS)
        page = search_page(index, mode=QueryMode.LEXICAL, k=5, identity={}, text="bucks")
        assert [h.key for h in page.hits] == ["/p/0.jpg"]
        (match,) = page.hits[0].text_matches
        assert match == {
            "text": "STARBUCKS COFFEE",
            "box": BOX,
            "confidence": 0.9,
            "frame": [640, 480],
        }
        page = search_page(
            index, mode=QueryMode.HYBRID, k=8, identity={}, text="starbucks", vector=unit(5)
        )
        by_key = {h.key: h.text_matches for h in page.hits}
        assert [m["text"] for m in by_key["/p/2.jpg"]] == ["STARBUGKS"]
        assert by_key["/p/5.jpg"] == ()  # found by its vector only
        near = index.search(unit(5), 8, where=parse_where({"$has_text": True}))
        assert sorted(h.key for h in near) == ["/p/0.jpg", "/p/1.jpg", "/p/2.jpg"]


def test_query_words_are_letters_and_digits_folded_like_the_text(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(items(), dim=DIM)
        index.store.set_ocr(
            {
                "/p/0.jpg": reading("STARBUCKS COFFEE"),
                "/p/1.jpg": reading("ÇA VA, MERCI"),
                "/p/2.jpg": reading("Hotel (Ritz)"),
                "/p/3.jpg": reading("ＴＯＫＹＯ ｔｏｗｅｒ"),  # full-width
            }
        )
        for punctuated in ['"hotel"', "hotel.", "(ritz"]:
            assert found(index, punctuated) == ["/p/2.jpg"], punctuated
        for punctuated in ["bucks,", "bucks?", "(bucks", "«starbucks»", "ＳＴＡＲＢＵＣＫＳ"]:
            assert found(index, punctuated) == ["/p/0.jpg"], punctuated
        for accented in ["ça", "ÇA", "ça va", "merci!"]:  # SQLite's lower() folds ASCII only
            assert found(index, accented) == ["/p/1.jpg"], accented
        assert found(index, "tokyo tower") == ["/p/3.jpg"]
        assert found(index, "?!") == []  # no word at all
        page = search_page(index, mode=QueryMode.LEXICAL, k=5, identity={}, text="(bucks)")
        assert [m["text"] for m in page.hits[0].text_matches] == ["STARBUCKS COFFEE"]


def test_a_nul_in_the_query_is_refused_naming_it(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(items(), dim=DIM)
        index.store.set_ocr(READINGS)
        for mode in (QueryMode.LEXICAL, QueryMode.HYBRID):
            with pytest.raises(InputError, match="NUL"):
                search_page(index, mode=mode, k=5, identity={}, text="bu\x00cks", vector=unit(1))


def test_readings_follow_their_items(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        store = index.store
        store.upsert(items(), dim=DIM)
        store.set_ocr(READINGS)
        assert sorted(store.unread_under("/p")) == [f"/p/{i}.jpg" for i in range(4, 8)]
        ids = {store.get(k).id: k for k in READINGS}  # type: ignore[union-attr]
        got = store.ocr_readings(list(ids))
        assert {ids[i]: r for i, r in got.items()} == READINGS
        # The same content written again keeps its reading; other content loses it.
        store.upsert([items()[0]], dim=DIM)
        assert found(index, "bucks") == ["/p/0.jpg"]
        changed = ItemRow(key="/p/0.jpg", path="/p/0.jpg", sha256="f" * 64, vector=unit(0))
        store.upsert([changed], dim=DIM)
        assert found(index, "bucks") == []
        assert "/p/0.jpg" in store.unread_under("/p")
        # Renamed: the reading goes along; deleted: it goes too.
        store.rename("/p/1.jpg", "/p/9.jpg", path="/p/9.jpg", size=1, mtime_ns=1)
        assert found(index, "thank") == ["/p/9.jpg"]
        store.delete_keys(["/p/9.jpg"])
        assert found(index, "thank") == []
        # A reading replaced.
        store.set_ocr({"/p/2.jpg": reading("NEW SIGN")})
        assert found(index, "sign") == ["/p/2.jpg"] and found(index, "starbugks") == []


def test_bad_readings_are_refused_whole(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(items(2), dim=DIM)
        bad = {"/p/0.jpg": reading("OK"), "/p/1.jpg": {"lines": [{"text": "x", "box": [1]}]}}
        with pytest.raises(SearchIndexError, match="/p/1.jpg"):
            index.store.set_ocr(bad)
        with pytest.raises(SearchIndexError, match="not an OCR reading"):
            index.store.set_ocr({"/p/0.jpg": {"lines": 3}})
        assert found(index, "ok") == []


def test_an_index_without_ocr_has_no_rows(tmp_path: Any) -> None:
    path = tmp_path / "i.db"
    with VectorIndex(str(path)) as index:
        index.bind_model(STAMP)
        index.store.upsert(items(), dim=DIM)
        assert found(index, "bucks") == []
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM ocr").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM ocr_lexical").fetchone() == (0,)
    db.close()


def test_readings_made_before_a_stop_are_kept(location: str, tmp_path: Path) -> None:
    """SIGTERM reaches ``index --ocr`` as an exception in its main thread (as Ctrl-C does):
    what was read in the chunk in flight is saved, not read again next time."""

    class Stopped(BaseException):
        pass

    seen: list[Path] = []

    def read_text(path: Path) -> dict[str, Any]:
        if len(seen) == 5:
            raise Stopped
        seen.append(path)
        return reading(["ALPHA", "BRAVO", "CHARLIE", "DELTA", "ECHO"][len(seen) - 1])

    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        rows = [
            ItemRow(key=str(tmp_path / f"{i}.jpg"), path=str(tmp_path / f"{i}.jpg"), vector=unit(i))
            for i in range(8)
        ]
        index.store.upsert(rows, dim=DIM)
        report = IndexReport()
        with pytest.raises(Stopped):
            read_texts(index.store, tmp_path, read_text, report, chunk=128)
        assert report.read == 5
        assert isinstance(index.store, Lexical)
        assert len(index.store.unread_under(str(tmp_path))) == 3
        assert found(index, "echo") == [str(seen[4])]
