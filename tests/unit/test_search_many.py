"""``VectorIndex.search_many`` answers as ``search`` does, query by query, on every path: exact,
each graph vector type (one batch on every core), filters, ``where``; bad input is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fakes import DIM, STAMP, unit
from themis_clip import IndexModelMismatchError, MetadataError, SearchIndexError
from themis_clip.config import SearchConfig
from themis_clip.index.search import Hit, VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.index.where import with_filters

N = 400


def fill(index: VectorIndex) -> None:
    index.bind_model(STAMP)
    index.store.upsert(
        [
            ItemRow(key=f"k{i}", vector=unit(i), metadata={"even": i % 2 == 0, "n": i})
            for i in range(N)
        ],
        dim=DIM,
    )


def queries(count: int) -> np.ndarray:
    return np.stack([unit(f"q{i}") for i in range(count)] + [unit(17)]).astype(np.float32)


def same(batch: list[list[Hit]], one_by_one: list[list[Hit]]) -> None:
    assert len(batch) == len(one_by_one)
    for got, want in zip(batch, one_by_one, strict=True):
        assert [h.key for h in got] == [h.key for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-6)
        assert [(h.path, h.metadata) for h in got] == [(h.path, h.metadata) for h in want]


@pytest.mark.parametrize(
    ("threshold", "dtype"),
    [(10_000, "i8"), (50, "i8"), (50, "f16"), (50, "f32")],  # exact, then each graph type
)
def test_search_many_equals_search_query_by_query(
    tmp_path: Path, threshold: int, dtype: str
) -> None:
    settings = SearchConfig(graph_dtype=dtype)  # type: ignore[arg-type]
    with VectorIndex(tmp_path / "i.db", exact_threshold=threshold, settings=settings) as index:
        fill(index)
        q = queries(40)
        assert index.mode == ("exact" if threshold > N else "hnsw")
        for k in (1, 10, 37):
            same(index.search_many(q, k), [index.search(v, k) for v in q])
        same(
            index.search_many(q, 10, where=with_filters({"even": True})),
            [index.search(v, 10, where=with_filters({"even": True})) for v in q],
        )
        where = {"n": {"$gte": 100}}
        same(index.search_many(q, 10, where=where), [index.search(v, 10, where=where) for v in q])
        assert index.search_many(q, 3)[-1][0].key == "k17"  # the batch keeps the query order
    with VectorIndex(tmp_path / "i.db", readonly=True, exact_threshold=threshold) as ro:
        same(ro.search_many(q, 10), [ro.search(v, 10) for v in q])  # memory-mapped graph


def test_search_many_refuses_bad_input(tmp_path: Path) -> None:
    with VectorIndex(tmp_path / "i.db") as index:
        assert index.search_many(np.zeros((2, DIM), np.float32)) == [[], []]  # empty index
        fill(index)
        assert index.search_many(np.zeros((0, DIM), np.float32)) == []
        with pytest.raises(SearchIndexError, match=r"\(n, dim\) matrix"):
            index.search_many(unit(1))
        with pytest.raises(IndexModelMismatchError, match="3 dimensions"):
            index.search_many(np.ones((2, 3), np.float32))
        bad = queries(3)
        bad[2, 0] = np.nan
        with pytest.raises(SearchIndexError, match="query 2 has NaN"):
            index.search_many(bad)
        with pytest.raises(SearchIndexError, match="k = 0"):
            index.search_many(queries(1), 0)
        with pytest.raises(MetadataError, match="no item in this index has the metadata key"):
            index.search_many(queries(2), 5, where=with_filters({"colour": "red"}))
