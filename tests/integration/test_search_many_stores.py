"""``VectorIndex.search_many`` on every store (PostgreSQL: one query at a time) equals ``search``."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fakes import DIM, STAMP, unit
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.index.where import with_filters


def test_search_many_equals_search_on_every_store(location: str) -> None:
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(
            [ItemRow(key=f"k{i}", vector=unit(i), metadata={"odd": i % 2}) for i in range(60)],
            dim=DIM,
        )
        queries = np.stack([unit(f"q{i}") for i in range(8)] + [unit(5)])
        for filters in (None, {"odd": 1}):
            batch = index.search_many(queries, 7, where=with_filters(filters))
            single = [index.search(q, 7, where=with_filters(filters)) for q in queries]
            assert [[h.key for h in hits] for hits in batch] == [
                [h.key for h in hits] for hits in single
            ]
            for got, want in zip(batch, single, strict=True):
                assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-6)
        assert index.search_many(queries, 1)[-1][0].key == "k5"
        assert index.search_many(np.zeros((0, DIM), np.float32), 3) == []
