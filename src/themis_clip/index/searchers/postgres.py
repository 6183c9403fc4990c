"""Searching a PostgreSQL store: pgvector's HNSW index, measured as :mod:`..tuning` measures
ours (the smallest ``hnsw.ef_search`` whose recall@10 against an exact scan reaches the target).

Without filters a search walks pgvector's HNSW index (``vector_cosine_ops``; with pgvector 0.7
or later it holds ``halfvec`` and its candidates are re-scored exactly against the stored
float32 ``embedding`` column in the same query); with filters it scans the matching rows
exactly (an HNSW scan filters after the fact and could return fewer than ``k``).
:meth:`PgSearcher.prepare` builds the HNSW index and measures ``ef_search``; the
:class:`~..settings.SearchPlan` it records in the store's meta is what later searches use.

A stored vector makes a poor query: it sits in the graph, linked to its neighbours, so search
finds them too easily. Rows cannot be held out of a shared database's index, so each query is
a fresh point near a sampled member: the member moved by its own nearest-neighbour distance
along a random mix of the directions to its neighbours (in the data's local subspace). Its
true neighbours come from an exact scan. Measured at 100k embedding-like vectors against
held-out queries (``bench/bench_search.py``): members as queries claim recall@10 0.998 at
``ef_search`` 40 where fresh queries get 0.974; a step in a random direction claims 0.988
(fresh: 0.978); this construction is the conservative one (it chose 160, where fresh queries
get 0.999, and 64 already gives 0.993). A returned item counts when its score reaches the true
10th score (ties are not misses).

The SQL runs on the store's connection (:meth:`PgStore.connection`); the driver and the
adapter stay in :mod:`..stores.postgres`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.index.settings import GraphDType, GraphSettings, SearchKind, SearchPlan
from themis_clip.index.stores.pgschema import filter_sql
from themis_clip.index.stores.postgres import PgStore
from themis_clip.index.where import Where
from themis_clip.index.wheresql import compile_postgres

__all__ = ["EF_SWEEP", "PgSearcher", "measure_ef_search"]

#: ``hnsw.ef_search`` values tried, cheapest first (pgvector's largest is 1000).
EF_SWEEP = (40, 64, 100, 160, 250, 400, 640, 1000)
#: Queries per measurement: each exact one is a full scan of the table.
SAMPLE = 60
_MAX_EF = 1000  # pgvector's largest hnsw.ef_search
_HNSW = "themis_items_hnsw"


class PgSearcher:
    """Searches a :class:`PgStore` in the database (several servers share one index)."""

    def __init__(
        self,
        store: PgStore,
        settings: GraphSettings,
        *,
        progress: Callable[[str, int, int], object] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.progress = progress
        self._plan_cache: tuple[str | None, SearchPlan | None] = ("", None)

    building = False  # the HNSW index is built by prepare(), never in the background

    def close(self) -> None:
        """Nothing of its own to save: the database keeps the index."""

    def stats(self) -> dict[str, Any]:
        return {}

    def _state(self) -> tuple[SearchPlan | None, bool]:
        """The measured plan and whether the HNSW index exists, in one round trip, parsed
        again only when the write version moved (recording a plan or an index moves it)."""
        with self.store.connection() as db:
            version, text, indexed = db.execute(
                "SELECT (SELECT value FROM themis_meta WHERE key = 'write_version'), "
                "(SELECT value FROM themis_meta WHERE key = 'search_plan'), "
                "to_regclass('themis_items_hnsw') IS NOT NULL"
            ).fetchone()
        if self._plan_cache[0] != version:
            self._plan_cache = (version, SearchPlan.from_json(text))
        return self._plan_cache[1], bool(indexed)

    @property
    def mode(self) -> SearchKind:
        return SearchKind.PGVECTOR if self._state()[1] else SearchKind.EXACT

    def search(
        self,
        query: npt.NDArray[np.float32],
        k: int,
        filters: Mapping[str, Any] | None,
        dim: int,
        *,
        where: Where | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        return self.nearest(query, k, filters, where=where)

    def _hnsw_index(self, db: Any) -> bool:
        row = db.execute(f"SELECT to_regclass('{_HNSW}')").fetchone()
        return row[0] is not None

    def nearest(
        self,
        query: npt.NDArray[np.float32],
        k: int,
        filters: Mapping[str, Any] | None,
        *,
        expansion_search: int | None = None,
        exact: bool = False,
        where: Where | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Top ``k`` ``(ids, cosine scores)``: pgvector's HNSW index without filters; with
        filters an exact scan of the matching rows (an HNSW scan filters after the fact and
        could return fewer than ``k``)."""
        plan, indexed = self._state()
        ef = expansion_search or (plan.expansion_search if plan else None) or 40
        q = np.ascontiguousarray(query, dtype=np.float32)
        with self.store.connection() as db, db.transaction():
            if filters or where is not None:
                clause, params = _clauses(filters, where)
                db.execute("SET LOCAL enable_indexscan = off")
                sql = (
                    "SELECT id, 1 - (embedding <=> %s) FROM themis_items "  # noqa: S608
                    f"WHERE {clause} ORDER BY embedding <=> %s LIMIT %s"
                )
                rows = db.execute(sql, [q, *params, q, k]).fetchall()
            else:
                exact = exact or k > _MAX_EF  # more than an HNSW scan can return: scan
                if exact:
                    db.execute("SET LOCAL enable_indexscan = off")
                halfvec = not exact and self.store.halfvec and indexed
                fetch = max(3 * k, 40) if halfvec else k  # halfvec candidates are re-scored
                db.execute(f"SET LOCAL hnsw.ef_search = {min(max(fetch, ef), _MAX_EF)}")
                if halfvec:
                    rows = self._nearest_halfvec(db, q, k, fetch)
                else:
                    rows = db.execute(
                        "SELECT id, 1 - (embedding <=> %s) FROM themis_items "
                        "ORDER BY embedding <=> %s LIMIT %s",
                        (q, q, k),
                    ).fetchall()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        scores = np.fromiter((r[1] for r in rows), dtype=np.float32, count=len(rows))
        return ids, scores

    def _nearest_halfvec(self, db: Any, q: Any, k: int, fetch: int) -> list[Any]:
        """``fetch`` f16 candidates from the halfvec index, re-scored exactly against
        ``embedding`` (the caller has set ``hnsw.ef_search``)."""
        dim = len(q)
        sql = (
            "SELECT id, 1 - (embedding <=> %s) AS score FROM (SELECT id, embedding "  # noqa: S608
            f"FROM themis_items ORDER BY embedding::halfvec({dim}) <=> %s::halfvec({dim}) "
            "LIMIT %s) AS c ORDER BY score DESC LIMIT %s"
        )
        return list(db.execute(sql, (q, self.store.as_halfvec(q), fetch, k)).fetchall())

    def prepare(
        self,
        dim: int,
    ) -> bool:
        """Build pgvector's HNSW index if missing, then measure the smallest ``ef_search``
        reaching the target recall@10 on a sample of stored vectors (recorded as the plan).

        Returns:
            True if the HNSW index was built.
        """
        count = self.store.count()
        if not count:
            return False
        built = False
        progress = self.progress
        with self.store.connection() as db:
            if not self._hnsw_index(db):
                if progress:
                    progress("pgvector HNSW index", 0, count)
                ops = (
                    f"(embedding::halfvec({dim})) halfvec_cosine_ops"
                    if self.store.halfvec
                    else "embedding vector_cosine_ops"
                )
                # pgvector builds fast while the graph fits in memory: about the vectors plus
                # 2m links of 8 bytes per item, with room; at least 1 GB, at most 8 GB.
                need_mb = count * (4 * dim + 2 * 16 * 8 + 64) * 1.3 / 2**20
                db.execute(f"SET maintenance_work_mem = '{int(min(max(need_mb, 1024), 8192))}MB'")
                db.execute("SET max_parallel_maintenance_workers = 2")
                db.execute(
                    f"CREATE INDEX IF NOT EXISTS {_HNSW} ON themis_items "
                    f"USING hnsw ({ops}) WITH (m = 16, ef_construction = 64)"
                )
                db.execute("RESET maintenance_work_mem")
                db.execute("RESET max_parallel_maintenance_workers")
                built = True
                if progress:
                    progress("pgvector HNSW index", count, count)
        self.store.set_meta(
            {"search_plan": measure_ef_search(self, self.settings, count).to_json()}
        )
        return built

    def sample(self, n: int) -> list[tuple[int, npt.NDArray[np.float32]]]:
        """``n`` stored ``(id, vector)`` pairs, the same ones each time (ordered by a hash)."""
        with self.store.connection() as db:
            rows = db.execute(
                "SELECT id FROM themis_items ORDER BY md5(id::text) LIMIT %s", (n,)
            ).fetchall()
        ids = [int(r[0]) for r in rows]
        dim = int(self.store.meta()["dim"])
        return list(zip(ids, self.store.vectors_by_id(ids, dim), strict=True))

    def exact_nearest(
        self, query: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Top ``k`` by a full scan (the HNSW index switched off): the ground truth."""
        return self.nearest(query, k, None, exact=True)

    def hnsw_bytes(self) -> int:
        """The size of pgvector's HNSW index (0 before :meth:`prepare` built it)."""
        with self.store.connection() as db:
            if not self._hnsw_index(db):
                return 0
            row = db.execute(f"SELECT pg_relation_size('{_HNSW}')").fetchone()
        return int(row[0] or 0)


def _fresh_point(
    searcher: PgSearcher, qid: int, member: npt.NDArray[np.float32], rng: np.random.Generator
) -> npt.NDArray[np.float32]:
    """A unit vector where a new item near ``member`` could be: ``member`` moved by its
    nearest-neighbour distance along a random mix of the directions to its 10 nearest
    neighbours (so it stays in the data's local subspace, as fresh items do)."""
    ids, scores = searcher.exact_nearest(member, 11)
    others = [int(i) for i in ids if i != qid][:10]
    if not others:
        return member
    gap = float(
        np.sqrt(
            max(
                0.0, 2.0 - 2.0 * float(max(s for i, s in zip(ids, scores, strict=True) if i != qid))
            )
        )
    )
    directions = searcher.store.vectors_by_id(others, len(member)) - member
    step = rng.standard_normal(len(others)).astype(np.float32) @ directions
    norm = float(np.linalg.norm(step))
    q = member + (gap * step / norm if norm > 0 else 0.0)
    return (q / np.linalg.norm(q)).astype(np.float32)


def measure_ef_search(searcher: PgSearcher, settings: GraphSettings, count: int) -> SearchPlan:
    """Recall@10 and latency of the HNSW index per ``ef_search``, and the plan chosen."""
    store = searcher.store
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    queries, truth, exact_ms = [], [], []
    for qid, member in searcher.sample(min(settings.sample, SAMPLE, count)):
        q = _fresh_point(searcher, qid, member, rng)
        t0 = time.perf_counter()
        _, scores = searcher.exact_nearest(q, 10)
        exact_ms.append((time.perf_counter() - t0) * 1000)
        queries.append(q)
        truth.append(float(scores[-1]) if len(scores) else 1.0)
    exact_p50 = float(np.percentile(exact_ms, 50))
    want = min(10, count)
    sweep: list[dict[str, Any]] = []
    chosen: dict[str, Any] | None = None
    for ef in EF_SWEEP:
        hits, total, times = 0, 0, []
        for q, kth in zip(queries, truth, strict=True):
            t0 = time.perf_counter()
            _, scores = searcher.nearest(q, 10, None, expansion_search=ef)
            times.append((time.perf_counter() - t0) * 1000)
            hits += sum(1 for s in scores.tolist() if s >= kth - 1e-5)
            total += want
        recall = hits / total if total else 1.0
        point = {
            "expansion_search": ef,
            "recall_at_10": round(recall, 4),
            "p50_ms": float(np.percentile(times, 50)),
            "p99_ms": float(np.percentile(times, 99)),
        }
        sweep.append(point)
        if recall >= settings.target_recall:
            chosen = point
            break
    chosen = chosen or max(sweep, key=lambda p: p["recall_at_10"])
    met = chosen["recall_at_10"] >= settings.target_recall
    kind = "halfvec" if store.halfvec else "vector"
    return SearchPlan(
        kind=SearchKind.PGVECTOR,
        items=count,
        reason=(
            f"pgvector HNSW (m 16, {kind}), ef_search {chosen['expansion_search']}: recall@10 "
            f"{chosen['recall_at_10']:.3f} in {chosen['p50_ms']:.2f} ms (exact scan "
            f"{exact_p50:.2f} ms)" + ("" if met else "; target not reached")
        ),
        exact_p50_ms=exact_p50,
        dtype=GraphDType.F16 if store.halfvec else GraphDType.F32,
        connectivity=16,
        expansion_add=64,
        expansion_search=chosen["expansion_search"],
        recall_at_10=chosen["recall_at_10"],
        p50_ms=chosen["p50_ms"],
        p99_ms=chosen["p99_ms"],
        graph_bytes_per_item=searcher.hnsw_bytes() / count,
        target_recall=settings.target_recall,
        tuning_s=time.perf_counter() - started,
        steps=[{"connectivity": 16, "expansion_add": 64, "sweep": sweep}],
    )


def _clauses(filters: Mapping[str, Any] | None, where: Where | None) -> tuple[str, list[Any]]:
    """The equality ``filters`` and the ``where`` filter as one WHERE clause (bound values)."""
    parts, params = [], []
    if filters:
        clause, values = filter_sql(filters)
        parts.append(clause)
        params += values
    if where is not None:
        clause, values = compile_postgres(where)
        parts.append(clause)
        params += values
    return " AND ".join(parts), params
