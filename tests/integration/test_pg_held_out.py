"""pgvector's HNSW index leaves sampled rows out as the tuner's held-out queries (issue 30 item
5): the searches still find every stored row, the planner still walks the index, the held-out
rows' changes are seen at once, and an index built before (every row in it) still works."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.fakes import clustered, unit_rows
from themis_clip.index.search import ModelStamp, VectorIndex
from themis_clip.index.searchers.postgres import (
    MIN_HELD_OUT,
    PgSearcher,
    held_out_count,
    held_out_ids,
)
from themis_clip.index.settings import GraphSettings
from themis_clip.index.stores import ItemRow

pytestmark = pytest.mark.postgres

DIM = 64
N = 3_000


def filled(url: str, data: np.ndarray) -> VectorIndex:
    index = VectorIndex(url, settings=GraphSettings(target_recall=0.95))
    index.bind_model(ModelStamp(model_id="t@1", sha256="ab" * 32, dim=DIM))
    index.store.upsert([ItemRow(key=str(i), vector=v) for i, v in enumerate(data)], dim=DIM)
    return index


def searcher(index: VectorIndex) -> PgSearcher:
    pg = index.searcher
    assert isinstance(pg, PgSearcher)
    return pg


def hnsw_scans(index: VectorIndex, *, at_least: int = 0) -> int:
    """The HNSW index's scans so far, polled until they reach ``at_least`` (a backend reports
    its counts a second or more after its statements, ten at most when idle)."""
    deadline = time.monotonic() + 20
    while True:
        with searcher(index).store.connection() as db:
            db.execute("SELECT pg_stat_clear_snapshot()")
            (scans,) = db.execute(
                "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes "
                "WHERE indexrelname = 'themis_items_hnsw'"
            ).fetchone()
        if int(scans) >= at_least or time.monotonic() > deadline:
            return int(scans)
        time.sleep(0.2)


def test_the_predicate_is_read_back_and_small_tables_hold_every_row() -> None:
    assert held_out_ids("(id <> ALL ('{3,17,42}'::bigint[]))") == (3, 17, 42)
    assert held_out_ids(None) == () and held_out_ids("(id > 5)") == ()
    settings = GraphSettings()
    assert held_out_count(settings, 1_000_000) == 1_000  # pgtuning.HELD_OUT
    assert held_out_count(settings, 1_000) == 200  # at most a fifth
    assert held_out_count(settings, 5 * MIN_HELD_OUT - 1) == 0


def test_held_out_rows_are_found_and_the_index_is_walked(pg_url: str) -> None:
    data = clustered(np.random.default_rng(0), N, DIM)
    with filled(pg_url, data) as index:
        assert index.prepare_graph() is True
        pg = searcher(index)
        held = pg.held_out()
        assert len(held) == held_out_count(index.settings, N) == N // 5
        plan = index.plan
        assert plan is not None and plan.steps[0]["probes"] == len(held)
        assert plan.steps[0]["calibration"]["queries"] == "held-out rows"
        assert "held-out rows" in plan.reason
        sweep = plan.steps[0]["sweep"]
        before = hnsw_scans(index, at_least=len(sweep) * len(held))  # the tuner's, reported
        for i in held[:20]:  # ids are 1-based, keys are the rows
            hits = index.search(data[i - 1], 5)
            assert hits[0].key == str(i - 1) and hits[0].score == pytest.approx(1.0, abs=1e-5)
            ids, _ = pg.nearest(data[i - 1], 5, None, graph_only=True)
            assert i not in ids.tolist()  # not in the graph itself
        assert (
            hnsw_scans(index, at_least=before + 20) >= before + 20
        )  # the partial index is used, not a scan
        # Against an exact scan: the merged answer is the exact top 10 for most queries.
        queries = unit_rows(data[:50] + 0.05 * np.random.default_rng(1).standard_normal((50, DIM)))
        same = 0
        for q in queries:
            ids, scores = pg.nearest(q, 10, None)
            exact_ids, exact = pg.exact_nearest(q, 10)
            assert np.all(np.diff(scores) <= 1e-6)  # best first
            same += int(set(ids.tolist()) == set(exact_ids.tolist()))
            assert scores[0] == pytest.approx(exact[0], abs=1e-5)
        assert same >= 45


def test_a_held_out_rows_change_or_removal_is_seen_at_once(pg_url: str) -> None:
    data = clustered(np.random.default_rng(2), N, DIM)
    with filled(pg_url, data) as index:
        index.prepare_graph()
        pg = searcher(index)
        first, second = pg.held_out()[:2]
        far = unit_rows(np.random.default_rng(3).standard_normal((1, DIM)))[0]
        assert index.search(data[first - 1], 1)[0].key == str(first - 1)  # read and cached
        index.store.upsert([ItemRow(key=str(first - 1), vector=far)], dim=DIM)
        hit = index.search(far, 1)[0]
        assert hit.key == str(first - 1) and hit.score == pytest.approx(1.0, abs=1e-5)
        assert index.search(data[first - 1], 1)[0].key != str(first - 1)
        assert index.store.delete_keys([str(second - 1)]) == 1
        assert all(h.key != str(second - 1) for h in index.search(data[second - 1], 10))


def test_an_index_holding_every_row_is_searched_and_tuned_on_constructed_probes(
    pg_url: str,
) -> None:
    data = clustered(np.random.default_rng(4), N, DIM)
    with filled(pg_url, data) as index:
        pg = searcher(index)
        ops = (
            f"(embedding::halfvec({DIM})) halfvec_cosine_ops"
            if pg.store.halfvec
            else "embedding vector_cosine_ops"
        )
        with pg.store.connection() as db:  # as an earlier version built it: no predicate
            db.execute(f"CREATE INDEX themis_items_hnsw ON themis_items USING hnsw ({ops})")
        assert index.prepare_graph() is False  # the index is there: only measured
        assert pg.held_out() == ()
        plan = index.plan
        assert plan is not None and plan.steps[0]["calibration"]["queries"] == "constructed probes"
        before = hnsw_scans(index)
        hits = index.search(data[7], 3)
        assert hits[0].key == "7" and hnsw_scans(index, at_least=before + 1) > before
