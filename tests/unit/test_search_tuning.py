"""The self-tuning search: measured plans, compact graphs with exact re-scoring, catching up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fakes import clustered, unit_rows
from themis_clip import ConfigError, MetadataError, SearchIndexError
from themis_clip.config import SearchConfig
from themis_clip.index.ann import HNSWIndex
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.index.stores.sqlite import SQLiteStore
from themis_clip.index.tuning import tune
from themis_clip.index.where import with_filters
from themis_clip.vocabulary import ModelIdentity

# Always measure a graph (at these sizes exact search is well under a millisecond).
MEASURE = SearchConfig(exact_fast_ms=0.0)


def brute_top(data: np.ndarray, q: np.ndarray, k: int) -> set[int]:
    return set(np.argsort(-(data @ q))[:k].tolist())


def fill(path: Path, data: np.ndarray, **kw: object) -> VectorIndex:
    index = VectorIndex(path, **kw)  # type: ignore[arg-type]
    index.bind_model(ModelIdentity.from_model_id("t@1", sha256="ab" * 32, dim=data.shape[1]))
    index.store.upsert(
        [ItemRow(key=str(i), vector=v, metadata={"odd": i % 2}) for i, v in enumerate(data)],
        dim=data.shape[1],
    )
    return index


def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    real = HNSWIndex.build.__func__  # type: ignore[attr-defined]
    calls: list[int] = []

    def counted(cls: type[HNSWIndex], *a: object, **kw: object) -> HNSWIndex:
        calls.append(int(kw["connectivity"]))  # type: ignore[call-overload]
        return real(cls, *a, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(HNSWIndex, "build", classmethod(counted))
    return calls


# The tuner's choices below rest on measured latencies with wide margins (5x and 10x); slow,
# so that a loaded machine runs them apart from the fast suite (bench/ proves the speeds).
@pytest.mark.slow
def test_the_tuner_meets_the_target_on_clustered_data_with_the_cheapest_graph() -> None:
    rng = np.random.default_rng(0)
    data = clustered(rng, 20_000, dim=256)  # exact search ~1 ms, the graph ~5 times cheaper
    plan, graph = tune(np.arange(1, 20_001, dtype=np.int64), data, MEASURE)
    assert plan.kind == "hnsw" and graph is not None
    assert plan.connectivity == 16 and plan.recall_at_10 is not None
    assert plan.recall_at_10 >= 0.98 and plan.p50_ms is not None
    assert plan.p50_ms < plan.exact_p50_ms
    assert plan.graph_bytes_per_item is not None and plan.graph_bytes_per_item < 256 * 2 + 400
    # The smallest expansion that reached the target: the one before it did not.
    sweep = plan.steps[0]["sweep"]
    assert sweep[-1]["expansion_search"] == plan.expansion_search
    assert sweep[-1]["recall_at_10"] - sweep[-1]["recall_se"] >= 0.98  # clears it by one SE
    assert all(p["recall_at_10"] - p["recall_se"] < 0.98 for p in sweep[:-1])


# A speed claim, so a benchmark's (bench_search.py --data random): on a loaded 2-core machine
# exact search over 40 MB slows (12 ms, memory-bound) more than a graph walk does (6.8 ms),
# and the tuner then rightly picks the graph. Run with --long on an idle machine.
@pytest.mark.long
def test_the_tuner_keeps_exact_search_on_random_data_and_says_why() -> None:
    rng = np.random.default_rng(1)
    # 20k random 512-d: exact ~2 ms; a graph needs a breadth near the whole set (~10x slower).
    data = unit_rows(rng.standard_normal((20_000, 512)).astype(np.float32))
    plan, graph = tune(np.arange(20_000, dtype=np.int64), data, MEASURE)
    assert plan.kind == "exact" and graph is None
    assert "faster than exact search" in plan.reason and plan.steps  # it measured, then gave up


def test_when_no_graph_beats_exact_search_the_tuner_keeps_exact_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decision itself, with the graph's latency fixed at ten times exact search's (what
    random data gives on an idle machine), so no machine's load can tip it."""
    import themis_clip.index.tuning as tuning

    monkeypatch.setattr(tuning, "measure_exact_ms", lambda *a, **k: (2.0, 2.0))
    monkeypatch.setattr(tuning._Sample, "latency", lambda *a, **k: (20.0, 25.0))
    data = clustered(np.random.default_rng(1), 5_000)  # reaches the target: speed decides
    plan, graph = tune(np.arange(5_000, dtype=np.int64), data, MEASURE)
    assert plan.kind == "exact" and graph is None
    assert "faster than exact search" in plan.reason and plan.steps  # it measured, then gave up


def test_cheap_exact_search_is_kept_without_building(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = count_builds(monkeypatch)
    data = clustered(np.random.default_rng(2), 2_000)  # exact search ~0.05 ms
    # A 5 ms bar, not the default 1 ms: 100x slack, which no loaded machine closes.
    plan, graph = tune(np.arange(2_000, dtype=np.int64), data, SearchConfig(exact_fast_ms=5.0))
    assert plan.kind == "exact" and graph is None and builds == []
    assert "exact search takes" in plan.reason


@pytest.mark.parametrize("dtype", ["f16", "i8"])
def test_compact_graphs_are_rescored_exactly_and_hold_recall(tmp_path: Path, dtype: str) -> None:
    rng = np.random.default_rng(3)
    both = clustered(rng, 20_100)
    data, queries = both[:20_000], both[20_000:]  # held out: never indexed
    settings = SearchConfig(graph_dtype=dtype)
    # exact_threshold 0: always a graph (timing decides nothing here; the tuner tests do that).
    with fill(tmp_path / "i.db", data, settings=settings, exact_threshold=0) as index:
        assert index.prepare_graph() is True
        plan = index.plan
        assert plan is not None and plan.kind == "hnsw" and plan.dtype == dtype
        stats = index.stats()
        assert stats["mode"] == "hnsw" and stats["graph"]["dtype"] == dtype
        per_item = stats["graph"]["bytes_per_item"]
        assert per_item < (64 * (2 if dtype == "f16" else 1)) + 400  # compact, not f32
        recalls = []
        for q in queries:
            hits = index.search(q, 10)
            got = [int(h.key) for h in hits]
            # Scores are the exact float32 cosines, not the graph's f16/i8 approximations.
            assert np.allclose([h.score for h in hits], data[got] @ q, atol=1e-6)
            recalls.append(len(set(got) & brute_top(data, q, 10)) / 10)
        assert np.mean(recalls) >= 0.97


def test_writes_catch_the_graph_up_without_rebuilding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = count_builds(monkeypatch)
    rng = np.random.default_rng(4)
    data = clustered(rng, 12_000)
    base, extra = data[:10_000], data[10_000:]
    with fill(tmp_path / "i.db", base, exact_threshold=0) as index:
        assert index.prepare_graph() is True and len(builds) == 1
        index.store.upsert([ItemRow(key=f"new{i}", vector=v) for i, v in enumerate(extra)], dim=64)
        index.store.delete_keys([str(i) for i in range(50)])
        moved = unit_rows(rng.standard_normal((1, 64)).astype(np.float32))[0]
        index.store.upsert([ItemRow(key="77", vector=moved)], dim=64)  # same key, new vector
        assert index.search(extra[5], 1)[0].key == "new5"
        assert index.search(moved, 1)[0].key == "77"
        assert all(h.key not in {str(i) for i in range(50)} for h in index.search(base[3], 10))
        assert index.mode == "hnsw" and len(builds) == 1  # caught up, not rebuilt
    # Saved on close, tagged current: a read-only open memory-maps it and sees the writes.
    with VectorIndex(tmp_path / "i.db", readonly=True) as ro:
        assert ro.mode == "hnsw"
        assert ro.search(extra[7], 1)[0].key == "new7"
        assert ro.stats()["plan"]["kind"] == "hnsw"


def test_a_saved_graph_behind_the_store_is_caught_up_by_the_next_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = clustered(np.random.default_rng(5), 10_000)
    with fill(tmp_path / "i.db", data, exact_threshold=0) as index:
        assert index.prepare_graph() is True
    with SQLiteStore(tmp_path / "i.db") as other:  # another process's write
        other.upsert(
            [ItemRow(key="late", vector=data[9]), ItemRow(key="x", vector=data[8])], dim=64
        )
        other.delete_keys(["x"])
    with VectorIndex(tmp_path / "i.db", readonly=True, exact_threshold=0) as ro:
        assert ro.mode == "exact"  # the saved graph is behind: exact, and still complete
        assert {h.key for h in ro.search(data[9], 2)} == {"9", "late"}
    builds = count_builds(monkeypatch)
    with VectorIndex(tmp_path / "i.db", exact_threshold=0) as rw:
        assert {h.key for h in rw.search(data[9], 2)} == {"9", "late"}
        assert rw.mode == "hnsw" and builds == []  # loaded and caught up
        assert rw.prepare_graph() is False  # saves the caught-up graph
    with VectorIndex(tmp_path / "i.db", readonly=True) as ro:
        assert ro.mode == "hnsw"
        assert {h.key for h in ro.search(data[9], 2)} == {"9", "late"}
        assert "x" not in {h.key for h in ro.search(data[8], 5)}


def test_filters_over_a_graph_are_complete(tmp_path: Path) -> None:
    data = clustered(np.random.default_rng(6), 10_000)
    with fill(tmp_path / "i.db", data, exact_threshold=0) as index:
        assert index.prepare_graph() is True
        q = data[10]
        hits = index.search(q, 10, where=with_filters({"odd": 1}))
        want = [i for i in np.argsort(-(data @ q)) if i % 2 == 1][:10]
        assert [int(h.key) for h in hits] == [int(i) for i in want]


def test_bad_queries_are_refused_clearly(tmp_path: Path) -> None:
    data = clustered(np.random.default_rng(7), 100)
    with fill(tmp_path / "i.db", data) as index:
        bad = data[0].copy()
        bad[3] = np.nan
        with pytest.raises(SearchIndexError, match="NaN"):
            index.search(bad, 5)
        for k in (0, -1, 10**9):
            with pytest.raises(SearchIndexError, match="expected 1 to"):
                index.search(data[0], k)
        with pytest.raises(MetadataError, match="keys must have 1 to"):
            index.search(data[0], 5, where=with_filters({"": 1}))
        with pytest.raises(MetadataError, match="no item in this index has the metadata key 'od'"):
            index.search(data[0], 5, where=with_filters({"od": 1}))
        assert (
            index.search(data[0], 5, where=with_filters({"odd": 7})) == []
        )  # a known key, no such value


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="dtype"):
        SearchConfig(graph_dtype="f64")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="target_recall"):
        SearchConfig(target_recall=1.5)


def test_a_broad_filter_whose_matches_lie_far_away_is_still_complete(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    near = clustered(rng, 3_000)
    far = unit_rows(-near[:1].repeat(22_000, 0) + 0.3 * rng.standard_normal((22_000, 64)))
    data = np.concatenate([near, far]).astype(np.float32)  # 22k far items match the filter
    with VectorIndex(tmp_path / "i.db", exact_threshold=0) as index:
        index.bind_model(ModelIdentity.from_model_id("t@1", sha256="ab" * 32, dim=64))
        index.store.upsert(
            [
                ItemRow(key=str(i), vector=v, metadata={"far": i >= 3_000})
                for i, v in enumerate(data)
            ],
            dim=64,
        )
        assert index.prepare_graph() is True
        found = 0
        for q in near[::150]:  # their graph neighbourhoods hold no match at all
            hits = index.search(q, 10, where=with_filters({"far": True}))
            got = [int(h.key) for h in hits]
            assert len(got) == 10 and all(i >= 3_000 for i in got)  # complete
            want = [i for i in np.argsort(-(data @ q)) if i >= 3_000][:10]
            found += len(set(got) & {int(i) for i in want})
        assert found / 200 >= 0.98  # and as accurate as a graph search is (approximate)


def test_i8_graphs_rank_by_inner_product_and_score_roughly_as_cosines(tmp_path: Path) -> None:
    data = clustered(np.random.default_rng(9), 5_000)
    ids = np.arange(1, len(data) + 1, dtype=np.int64)
    graph = HNSWIndex.build(ids, data, dtype="i8", expansion_search=64)
    assert graph.metric == "ip"  # "cos" renormalises quantised vectors at every distance
    found = 0
    for row in range(0, 5_000, 100):
        keys, scores = graph.search(data[row], 3)
        found += int(keys[0]) == row + 1  # a member finds itself
        true = data[keys - 1] @ data[row]
        assert np.all(np.abs(scores - true) < 0.3)  # integer products scaled back by 127²
    assert found >= 48
    # An i8 graph saved on the "cos" metric (before) loads and scores as 1 - distance.
    from usearch.index import Index

    old = Index(ndim=64, metric="cos", dtype="i8")
    old.add(ids.astype(np.uint64), data)
    old.save(str(tmp_path / "old.usearch"))
    loaded = HNSWIndex.open(tmp_path / "old.usearch", view=True)
    assert loaded is not None and loaded.metric == "cos"
    keys, scores = loaded.search(data[7], 3)
    assert np.all(np.abs(scores - data[keys - 1] @ data[7]) < 0.1)


def test_i8_codes_use_the_range_the_components_need(tmp_path: Path) -> None:
    # 512-d components are ~0.04: times 127 alone they would use a handful of levels.
    rng = np.random.default_rng(3)
    both = clustered(rng, 3_100, 512)
    data, queries = both[:3_000], both[3_000:]
    ids = np.arange(1, len(data) + 1, dtype=np.int64)
    graph = HNSWIndex.build(ids, data, dtype="i8", expansion_search=64)
    peak = float(np.quantile(np.abs(data).max(axis=1), 0.999))
    assert graph.i8_stretch is not None and 0.7 < graph.i8_stretch * peak <= 1.0
    gaps = []
    for q in queries:
        keys, scores = graph.search(q, 30)
        gaps.append(np.abs(scores - data[keys - 1] @ q))
    errors = np.concatenate(gaps)
    # Quantisation noise falls with the stretch (at 127 alone: mean 0.0026, worst 0.012).
    assert errors.mean() < 0.001 and errors.max() < 0.004
    # The stretch is read back from the saved codes, viewed or loaded, and later adds use it.
    graph.save(tmp_path / "g.usearch")
    viewed = HNSWIndex.open(tmp_path / "g.usearch", view=True)
    loaded = HNSWIndex.open(tmp_path / "g.usearch", view=False)
    assert viewed is not None and loaded is not None
    assert viewed.i8_stretch == loaded.i8_stretch == graph.i8_stretch
    more = clustered(np.random.default_rng(4), 200, 512)
    loaded.add(np.arange(5_001, 5_201, dtype=np.int64), more)
    keys, scores = loaded.search(more[17], 1)
    assert int(keys[0]) == 5_018 and abs(float(scores[0]) - 1.0) < 0.004


def test_an_i8_stretch_ignores_rare_outliers_and_reads_back_usearch_s_own_codes(
    tmp_path: Path,
) -> None:
    from usearch.index import Index

    from themis_clip.index.ann import choose_i8_stretch

    data = clustered(np.random.default_rng(5), 5_000, 512)
    usual = choose_i8_stretch(data)
    spiky = data.copy()
    spiky[:3] = 0.0
    spiky[:3, 0] = 1.0  # three vectors in 5,000 with one component at 1: clipped, not obeyed
    assert choose_i8_stretch(spiky) == usual > 1.0
    spiky[:100, 0] = 1.0  # one in fifty: the stretch makes room for them
    assert choose_i8_stretch(spiky) == 1.0
    # A graph usearch quantised itself (127 and truncation) reads back as stretch 1.
    ids = np.arange(1, 2_001, dtype=np.uint64)
    old = Index(ndim=512, metric="ip", dtype="i8")
    old.add(ids, data[:2_000])
    old.save(str(tmp_path / "old.usearch"))
    graph = HNSWIndex.open(tmp_path / "old.usearch", view=False)
    assert graph is not None and graph.i8_stretch == 1.0
    keys, scores = graph.search(data[5], 1)
    assert int(keys[0]) == 6 and abs(float(scores[0]) - 1.0) < 0.1


def test_the_tuner_takes_the_i8_stretch_from_the_whole_collection() -> None:
    from themis_clip.index.ann import choose_i8_stretch

    data = clustered(np.random.default_rng(6), 20_000)
    data[:10] = 0.0
    data[:10, 0] = 1.0  # ten spiky vectors, all in the graph's first segment
    ids = np.arange(1, len(data) + 1, dtype=np.int64)
    # A graph whatever the timings (under load exact search can win at 20k and keep none:
    # what this test checks is the graph's stretch, not that decision).
    plan, graph = tune(
        ids, data, SearchConfig(graph_dtype="i8", exact_fast_ms=0.0), threads=2, force_graph=True
    )
    assert graph is not None and plan.steps
    # One in 2,000 is too few to set the scale; in that first segment alone they would.
    assert graph.i8_stretch == choose_i8_stretch(data) > 1.0
    assert all(step.get("i8_stretch") == graph.i8_stretch for step in plan.steps)


def test_an_empty_index_is_tuned_to_exact_search_and_searched(tmp_path: Path) -> None:
    """An empty folder's index (a tryout's traceback: the tuner measured zero vectors)."""
    plan, graph = tune(
        np.zeros(0, np.int64), np.zeros((0, 16), np.float32), SearchConfig(), force_graph=True
    )
    assert plan.kind == "exact" and graph is None and plan.items == 0
    with VectorIndex(str(tmp_path / "e.db")) as index:
        index.bind_model(ModelIdentity.from_model_id("m@1", sha256="ab" * 32, dim=16))
        index.prepare_graph()
        assert index.search(unit_rows(np.ones((1, 16), np.float32))[0], 5) == []
