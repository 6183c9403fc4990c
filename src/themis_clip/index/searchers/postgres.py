"""Searching a PostgreSQL store: pgvector's HNSW index, measured as :mod:`..tuning` measures
ours (the smallest ``hnsw.ef_search`` whose recall@10 against an exact scan reaches the target).

Without filters a search walks pgvector's HNSW index (``vector_cosine_ops``; with pgvector 0.7
or later it holds ``halfvec`` and its candidates are re-scored exactly against the stored
float32 ``embedding`` column in the same query); with filters it scans the matching rows
exactly (an HNSW scan filters after the fact and could return fewer than ``k``).
:meth:`PgSearcher.prepare` builds the HNSW index and measures ``ef_search``; the
:class:`~..settings.SearchPlan` it records in the store's meta is what later searches use.

The HNSW index is partial: a thousand sampled rows (:func:`held_out_count`) are left out of
it (``WHERE id <> ALL ('{...}')``, the index's own predicate being the record of which), so
that :mod:`.pgtuning` can measure ``ef_search`` on queries the graph has never seen, as our
own graph's tuner does. A search walks the graph with that predicate (which is what lets the
planner use a partial index) and scores the held-out rows exactly in numpy (their vectors are
read once per write version: ~0.05 ms a query at 1,000 rows), so every stored row can be found.
An index built before this (no predicate) is searched as before, and tuned on constructed
probes.

The SQL runs on the store's connection (:meth:`PgStore.connection`); the driver and the
adapter stay in :mod:`..stores.postgres`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from themis_clip.index.searchers.pgtuning import EF_SWEEP, HELD_OUT, measure_ef_search
from themis_clip.index.settings import GraphSettings, SearchKind, SearchPlan
from themis_clip.index.stores.pgschema import filter_sql
from themis_clip.index.stores.postgres import PgStore
from themis_clip.index.where import Where
from themis_clip.index.wheresql import compile_postgres

__all__ = ["EF_SWEEP", "PgSearcher", "held_out_count", "measure_ef_search"]

_MAX_EF = 1000  # pgvector's largest hnsw.ef_search
_HNSW = "themis_items_hnsw"
#: Fewer held-out rows than this measure nothing: a smaller table's index holds every row.
MIN_HELD_OUT = 10
_ID_ARRAY = re.compile(r"'\{([-0-9, ]*)\}'")


def held_out_count(settings: GraphSettings, count: int) -> int:
    """How many of ``count`` rows an HNSW index built now leaves out as tuning queries:
    :data:`~.pgtuning.HELD_OUT`, at most a fifth of the rows (none below :data:`MIN_HELD_OUT`)."""
    n = min(settings.sample, HELD_OUT, count // 5)
    return n if n >= MIN_HELD_OUT else 0


def held_out_ids(predicate: str | None) -> tuple[int, ...]:
    """The ids an index's predicate (``pg_get_expr`` of ``pg_index.indpred``) leaves out."""
    if not predicate:
        return ()
    found = _ID_ARRAY.search(predicate)
    if found is None or "<>" not in predicate:
        return ()
    return tuple(int(x) for x in found.group(1).replace(" ", "").split(",") if x)


def _keep_out(held: tuple[int, ...]) -> str:
    """The partial index's predicate (bigint literals only: safe to format into SQL)."""
    return f"id <> ALL ('{{{','.join(str(int(i)) for i in held)}}}'::bigint[])"


class _State(NamedTuple):
    version: str | None
    plan: SearchPlan | None
    indexed: bool
    predicate: str | None  # the HNSW index's, as PostgreSQL prints it
    held: tuple[int, ...]


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
        self._cache = _State("", None, False, None, ())
        # The held-out rows keyed by (write version, ids): their ids, vectors and norms.
        self._side: tuple[tuple[str | None, tuple[int, ...]], Any, Any, Any] = (
            ("", ()),
            None,
            None,
            None,
        )

    building = False  # the HNSW index is built by prepare(), never in the background

    def close(self) -> None:
        """Nothing of its own to save: the database keeps the index."""

    def stats(self) -> dict[str, Any]:
        return {}

    def _state(self) -> _State:
        """The measured plan, whether the HNSW index exists and the rows it leaves out, in one
        round trip, parsed again only when the write version or the index's predicate moved
        (recording a plan moves the version)."""
        with self.store.connection() as db:
            version, text, indexed, predicate = db.execute(
                "SELECT (SELECT value FROM themis_meta WHERE key = 'write_version'), "  # noqa: S608
                "(SELECT value FROM themis_meta WHERE key = 'search_plan'), "
                f"to_regclass('{_HNSW}') IS NOT NULL, "
                "(SELECT pg_get_expr(indpred, indrelid) FROM pg_index "
                f"WHERE indexrelid = to_regclass('{_HNSW}'))"
            ).fetchone()
        cached = self._cache  # one tuple, replaced whole: threads see one state or the next
        if cached.version != version or cached.indexed != bool(indexed):
            cached = cached._replace(
                version=version, plan=SearchPlan.from_json(text), indexed=bool(indexed)
            )
        if cached.predicate != predicate:
            cached = cached._replace(predicate=predicate, held=held_out_ids(predicate))
        self._cache = cached
        return cached

    @property
    def mode(self) -> SearchKind:
        return SearchKind.PGVECTOR if self._state().indexed else SearchKind.EXACT

    def held_out(self) -> tuple[int, ...]:
        """The ids the HNSW index leaves out (none when it holds every row, or is missing)."""
        return self._state().held

    def held_out_rows(
        self, dim: int, state: _State | None = None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The held-out rows still stored, ``(ids, vectors)``, read again only when the write
        version or the index moved."""
        side = self._side_rows(dim, state or self._state())
        return side[1], side[2]

    def _side_rows(self, dim: int, state: _State) -> tuple[Any, Any, Any, Any]:
        key = (state.version, state.held)
        side = self._side
        if side[0] != key or side[2] is None or side[2].shape[1] != dim:
            ids, matrix = self.store.rows_by_id(state.held, dim)
            side = (key, ids, matrix, np.linalg.norm(matrix, axis=1))
            self._side = side
        return side

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
        graph_only: bool = False,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Top ``k`` ``(ids, cosine scores)``: pgvector's HNSW index without filters, merged
        with the rows it leaves out, scored exactly (``graph_only``: the index's answer alone,
        as the tuner measures it); with filters an exact scan of the matching rows (an HNSW
        scan filters after the fact and could return fewer than ``k``)."""
        state = self._state()
        plan, indexed = state.plan, state.indexed
        ef = expansion_search or (plan.expansion_search if plan else None) or 40
        q = np.ascontiguousarray(query, dtype=np.float32)
        held: tuple[int, ...] = ()
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
                else:
                    held = state.held if indexed else ()
                # The partial index's own predicate, so that the planner may use it.
                keep_out = f"WHERE {_keep_out(held)} " if held else ""
                halfvec = not exact and self.store.halfvec and indexed
                fetch = max(3 * k, 40) if halfvec else k  # halfvec candidates are re-scored
                db.execute(f"SET LOCAL hnsw.ef_search = {min(max(fetch, ef), _MAX_EF)}")
                if halfvec:
                    rows = self._nearest_halfvec(db, q, k, fetch, keep_out)
                else:
                    rows = db.execute(
                        "SELECT id, 1 - (embedding <=> %s) FROM themis_items "  # noqa: S608
                        f"{keep_out}ORDER BY embedding <=> %s LIMIT %s",
                        (q, q, k),
                    ).fetchall()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        scores = np.fromiter((r[1] for r in rows), dtype=np.float32, count=len(rows))
        if held and not graph_only:
            return self._with_held_out(state, q, k, ids, scores)
        return ids, scores

    def _with_held_out(
        self,
        state: _State,
        q: npt.NDArray[np.float32],
        k: int,
        ids: npt.NDArray[np.int64],
        scores: npt.NDArray[np.float32],
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The graph's top ``k`` merged with the held-out rows' exact cosine scores."""
        _, side_ids, side, side_norms = self._side_rows(len(q), state)
        if not len(side_ids):
            return ids, scores
        with np.errstate(invalid="ignore", divide="ignore"):
            norms = side_norms * np.linalg.norm(q)
            side_scores = ((side @ q) / norms).astype(np.float32)  # a zero vector: NaN, as pgvector
        all_ids = np.concatenate([ids, side_ids])
        all_scores = np.concatenate([scores, side_scores])
        rank = np.nan_to_num(all_scores, nan=-np.inf)  # NaN sorts last, as PostgreSQL sorts it
        order = np.argsort(-rank, kind="stable")[:k]
        return all_ids[order], all_scores[order]

    def _nearest_halfvec(self, db: Any, q: Any, k: int, fetch: int, keep_out: str) -> list[Any]:
        """``fetch`` f16 candidates from the halfvec index, re-scored exactly against
        ``embedding`` (the caller has set ``hnsw.ef_search``; ``keep_out``: the partial index's
        WHERE clause, or empty)."""
        dim = len(q)
        sql = (
            "SELECT id, 1 - (embedding <=> %s) AS score FROM (SELECT id, embedding "  # noqa: S608
            f"FROM themis_items {keep_out}ORDER BY embedding::halfvec({dim}) <=> "
            f"%s::halfvec({dim}) LIMIT %s) AS c ORDER BY score DESC LIMIT %s"
        )
        return list(db.execute(sql, (q, self.store.as_halfvec(q), fetch, k)).fetchall())

    def prepare(
        self,
        dim: int,
    ) -> bool:
        """Build pgvector's HNSW index if missing (leaving :func:`held_out_count` sampled rows
        out of it), then measure the smallest ``ef_search`` reaching the target recall@10 on
        them (:mod:`.pgtuning`; recorded as the plan).

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
                held = self._sample_ids(held_out_count(self.settings, count))
                keep_out = f" WHERE {_keep_out(held)}" if held else ""
                db.execute(
                    f"CREATE INDEX IF NOT EXISTS {_HNSW} ON themis_items "
                    f"USING hnsw ({ops}) WITH (m = 16, ef_construction = 64){keep_out}"
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

    def _sample_ids(self, n: int) -> tuple[int, ...]:
        """``n`` stored ids, the same ones each time (ordered by a hash), sorted."""
        if n <= 0:
            return ()
        with self.store.connection() as db:
            rows = db.execute(
                "SELECT id FROM themis_items ORDER BY md5(id::text) LIMIT %s", (n,)
            ).fetchall()
        return tuple(sorted(int(r[0]) for r in rows))

    def sample(self, n: int) -> list[tuple[int, npt.NDArray[np.float32]]]:
        """``n`` stored ``(id, vector)`` pairs, the same ones each time (ordered by a hash)."""
        ids = list(self._sample_ids(n))
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
