"""Searching a PostgreSQL store: pgvector's HNSW index, measured as :mod:`..tuning` measures
ours (the smallest ``hnsw.ef_search`` whose recall@10 against an exact scan reaches the target).

Without filters a search walks pgvector's HNSW index (``vector_cosine_ops``; with pgvector 0.7
or later it holds ``halfvec`` and its candidates are re-scored exactly against the stored
float32 ``embedding`` column in the same query); with filters it scans the matching rows
exactly (an HNSW scan filters after the fact and could return fewer than ``k``).
:meth:`PgSearcher.prepare` builds the HNSW index and measures ``ef_search``; the
:class:`~..settings.SearchPlan` it records in the store's meta is what later searches use.

How ``ef_search`` is measured (probe queries built from the stored vectors, calibrated against
held-out queries) is :mod:`.pgtuning`'s part.

The SQL runs on the store's connection (:meth:`PgStore.connection`); the driver and the
adapter stay in :mod:`..stores.postgres`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.index.searchers.pgtuning import EF_SWEEP, measure_ef_search
from themis_clip.index.settings import GraphSettings, SearchKind, SearchPlan
from themis_clip.index.stores.pgschema import filter_sql
from themis_clip.index.stores.postgres import PgStore
from themis_clip.index.where import Where
from themis_clip.index.wheresql import compile_postgres

__all__ = ["EF_SWEEP", "PgSearcher", "measure_ef_search"]

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
        reaching the target recall@10 on probe queries (:mod:`.pgtuning`; recorded as the plan).

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
