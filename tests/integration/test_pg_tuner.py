"""pgvector's ``ef_search`` tuner on a real PostgreSQL: its exact pass, and its queries (the
rows the partial HNSW index leaves out) against independent held-out queries (issue 30 item 5).

The data is shaped like the benchmark's embedding-like vectors (``bench/embedding_data.py``:
Zipf-sized clusters in a 32-d subspace of 512, noise 0.03 a coordinate), at 20k rows and a
target of 0.995 so that recall@10 is not saturated at pgvector's smallest ``ef_search``. With
the probes built as before (a member moved along a mix of the directions to its neighbours)
the tuner chose 100 here where held-out queries reach 0.996 at 64; with the member itself as
the probe, 40, where held-out queries get 0.983 (both checked by putting them back). On the
rows left out of the index it chooses 80, the cheapest reaching 0.995 on held-out queries
(0.9942 at 64, 0.9960 at 80; the rows read 0.9955 ± 0.002 at 64)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fakes import unit_rows
from themis_clip.index.search import ModelStamp, VectorIndex
from themis_clip.index.searchers import pgtuning
from themis_clip.index.searchers.pgtuning import EF_SWEEP, exact_top
from themis_clip.index.searchers.postgres import PgSearcher
from themis_clip.index.settings import GraphSettings
from themis_clip.index.stores import ItemRow

pytestmark = pytest.mark.postgres

DIM = 512
N = 20_000
TARGET = 0.995


def embedding_like(rng: np.random.Generator, n: int) -> np.ndarray:
    """``bench/embedding_data.py``'s clustered rows (its defaults), written out here."""
    basis = np.linalg.qr(rng.standard_normal((DIM, 32)))[0]
    centres = rng.standard_normal((2000, 32))
    sizes = 1.0 / np.arange(1, 2001) ** 0.8
    labels = rng.choice(2000, size=n, p=sizes / sizes.sum())
    x = unit_rows((centres[labels] + 0.6 * rng.standard_normal((n, 32))) @ basis.T)
    return unit_rows(x + 0.03 * rng.standard_normal((n, DIM)))


def filled(url: str, data: np.ndarray, settings: GraphSettings | None = None) -> VectorIndex:
    index = VectorIndex(url, settings=settings)
    index.bind_model(ModelStamp(model_id="t@1", sha256="ab" * 32, dim=data.shape[1]))
    for start in range(0, len(data), 5_000):
        rows = range(start, min(start + 5_000, len(data)))
        index.store.upsert([ItemRow(key=str(i), vector=data[i]) for i in rows], dim=data.shape[1])
    return index


def held_out_recall(pg: PgSearcher, ef: int, queries: np.ndarray, kth: np.ndarray) -> float:
    hits = 0
    for q, bar in zip(queries, kth, strict=True):
        _, scores = pg.nearest(q, 10, None, expansion_search=ef)
        hits += int(np.sum(scores >= bar - 1e-5))
    return hits / (10 * len(queries))


def test_the_exact_pass_reads_every_chunk_and_leaves_out_each_querys_own_row(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    data = embedding_like(rng, 2_500)
    monkeypatch.setattr(pgtuning, "CHUNK", 700)  # four chunks, the last one short
    with filled(pg_url, data) as index:
        pg = index.searcher
        assert isinstance(pg, PgSearcher)
        rows = np.asarray([5, 999, 2_499])
        queries = data[rows]
        ids, scores = exact_top(pg, queries, 10, exclude=rows + 1)  # ids are 1-based
        expected = queries @ data.T
        expected[np.arange(3), rows] = -np.inf
        order = np.argsort(-expected, axis=1)[:, :10]
        assert (ids == order + 1).all()
        np.testing.assert_allclose(scores, np.take_along_axis(expected, order, axis=1), atol=1e-5)
        ids, scores = exact_top(pg, queries, 3)  # nothing left out: each finds itself first
        assert (ids[:, 0] == rows + 1).all() and np.allclose(scores[:, 0], 1.0, atol=1e-5)


def test_the_probes_recall_curve_tracks_held_out_queries_and_the_choice_is_the_cheapest(
    pg_url: str,
) -> None:
    rng = np.random.default_rng(0)
    both = embedding_like(rng, N + 1_000)
    data, queries = both[:N], both[N:]  # held out: never stored
    kth = -np.partition(-(queries @ data.T), 9, axis=1)[:, 9]
    settings = GraphSettings(target_recall=TARGET)
    with filled(pg_url, data, settings) as index:
        assert index.prepare_graph() is True
        plan = index.plan
        pg = index.searcher
        assert plan is not None and plan.expansion_search is not None
        assert isinstance(pg, PgSearcher)
        held = {}
        for ef in EF_SWEEP:
            held[ef] = held_out_recall(pg, ef, queries, kth)
            if held[ef] >= TARGET and ef >= plan.expansion_search:
                break
        probes = {p["expansion_search"]: p["recall_at_10"] for p in plan.steps[0]["sweep"]}
        print("held-out", held, "probes", probes)
        cheapest = next(ef for ef, r in held.items() if r >= TARGET)
        # At most one step of the sweep (1.25x) above the cheapest setting that reaches the
        # target on held-out queries, and not short of it by more than sampling noise.
        assert EF_SWEEP.index(plan.expansion_search) <= EF_SWEEP.index(cheapest) + 1, (
            plan.expansion_search,
            cheapest,
        )
        assert held[plan.expansion_search] >= TARGET - 0.008
