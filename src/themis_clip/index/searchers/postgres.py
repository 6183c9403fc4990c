"""Searching a PostgreSQL store: pgvector's HNSW index, with ``hnsw.ef_search`` from a rule.

Without filters a search walks pgvector's HNSW index (``vector_cosine_ops``; with pgvector 0.7
or later it holds ``halfvec`` and its candidates are re-scored exactly against the stored
float32 ``embedding`` column in the same query); with filters it scans the matching rows
exactly (an HNSW scan filters after the fact and could return fewer than ``k``).
:meth:`PgSearcher.prepare` builds the HNSW index and records the
:class:`~..settings.SearchPlan` later searches use.

``ef_search`` is :func:`ef_search_for` the table's size unless the caller fixes it: a rule
fitted to held-out recall@10 measured at 100k, 300k and 1M rows (``bench/RESULTS.md``), since
a search is never the bottleneck beside the text tower and a measurement at index time cost
minutes.

The SQL runs on the store's connection (:meth:`PgStore.connection`); the driver and the
adapter stay in :mod:`..stores.postgres`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from themis_clip.config import SearchConfig
from themis_clip.index.settings import GraphDType, SearchKind, SearchPlan
from themis_clip.index.stores.postgres import PgStore
from themis_clip.index.where import Where
from themis_clip.index.wheresql import compile_postgres

__all__ = ["PgSearcher", "ef_search_for"]

_MIN_EF = 40  # pgvector's default hnsw.ef_search
_MAX_EF = 1000  # pgvector's largest hnsw.ef_search
_HNSW = "themis_items_hnsw"
_M, _EF_CONSTRUCTION = 16, 64  # pgvector's defaults
#: SQL for: the HNSW index exists and holds every row (no ``WHERE`` predicate: a partial
#: index, which searches without its predicate cannot use, is rebuilt by ``prepare``).
_PLAIN_INDEX = (
    "EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('themis_items_hnsw') "
    "AND indpred IS NULL)"
)


def ef_search_for(count: int) -> int:
    """``hnsw.ef_search`` for a table of ``count`` rows: 50 at 100k rows, growing as
    ``count ** 0.8`` (320 at 1M), rounded up to a multiple of 10, within pgvector's 40..1000.
    Fitted with one step of margin to where held-out recall@10 reaches 0.98 (40 at 100k, 80
    at 300k, 200-250 at 1M; ``halfvec`` 50 at 100k)."""
    ef = 10 * math.ceil(5 * (max(count, 1) / 100_000) ** 0.8)
    return int(min(max(ef, _MIN_EF), _MAX_EF))


class _State(NamedTuple):
    version: str | None
    plan: SearchPlan | None
    indexed: bool


class PgSearcher:
    """Searches a :class:`PgStore` in the database (several servers share one index).

    Args:
        expansion_search: a fixed ``hnsw.ef_search`` (None: :func:`ef_search_for`).
    """

    def __init__(
        self,
        store: PgStore,
        settings: SearchConfig,
        *,
        expansion_search: int | None = None,
        progress: Callable[[str, int, int], object] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.expansion_search = expansion_search
        self.progress = progress
        self._cache = _State("", None, False)

    building = False  # the HNSW index is built by prepare(), never in the background

    def close(self) -> None:
        """Nothing of its own to save: the database keeps the index."""

    def stats(self) -> dict[str, Any]:
        return {}

    def _state(self) -> _State:
        """The recorded plan and whether a plain HNSW index exists, in one round trip, parsed
        again only when the write version moved (recording a plan moves it)."""
        with self.store.connection() as db:
            version, text, indexed = db.execute(
                "SELECT (SELECT value FROM themis_meta WHERE key = 'write_version'), "  # noqa: S608
                "(SELECT value FROM themis_meta WHERE key = 'search_plan'), "
                f"{_PLAIN_INDEX}"
            ).fetchone()
        cached = self._cache  # one tuple, replaced whole: threads see one state or the next
        if cached.version != version or cached.indexed != bool(indexed):
            cached = _State(version, SearchPlan.from_json(text), bool(indexed))
            self._cache = cached
        return cached

    @property
    def mode(self) -> SearchKind:
        return SearchKind.PGVECTOR if self._state().indexed else SearchKind.EXACT

    def search(
        self,
        query: npt.NDArray[np.float32],
        k: int,
        dim: int,
        *,
        where: Where | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        return self.nearest(query, k, where=where)

    def nearest(
        self,
        query: npt.NDArray[np.float32],
        k: int,
        *,
        exact: bool = False,
        where: Where | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Top ``k`` ``(ids, cosine scores)``: pgvector's HNSW index without filters; with
        filters (or ``exact``) an exact scan of the matching rows (an HNSW scan filters after
        the fact and could return fewer than ``k``)."""
        state = self._state()
        plan = state.plan
        ef = self.expansion_search or (plan.expansion_search if plan else None) or _MIN_EF
        q = np.ascontiguousarray(query, dtype=np.float32)
        with self.store.connection() as db, db.transaction():
            if where is not None:
                clause, params = compile_postgres(where)
                db.execute("SET LOCAL enable_indexscan = off")
                sql = (
                    "SELECT id, 1 - (embedding <=> %s) FROM themis_items "  # noqa: S608
                    f"WHERE {clause} ORDER BY embedding <=> %s LIMIT %s"
                )
                rows = db.execute(sql, [q, *params, q, k]).fetchall()
            else:
                exact = exact or k > _MAX_EF or not state.indexed
                if exact:  # more than an HNSW scan can return, or no index: scan
                    db.execute("SET LOCAL enable_indexscan = off")
                halfvec = not exact and self.store.halfvec
                fetch = max(3 * k, _MIN_EF) if halfvec else k  # halfvec candidates re-scored
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
            f"FROM themis_items ORDER BY embedding::halfvec({dim}) <=> "
            f"%s::halfvec({dim}) LIMIT %s) AS c ORDER BY score DESC LIMIT %s"
        )
        return list(db.execute(sql, (q, self.store.as_halfvec(q), fetch, k)).fetchall())

    def prepare(self, dim: int) -> bool:
        """Build pgvector's HNSW index if there is no plain one (an index with a ``WHERE``
        predicate, which plain searches cannot use, is rebuilt), and record the plan.

        Returns:
            True if the HNSW index was built.
        """
        count = self.store.count()
        if not count:
            return False
        built = False
        progress = self.progress
        with self.store.connection() as db:
            (indexed,) = db.execute(f"SELECT {_PLAIN_INDEX}").fetchone()
            if not indexed:
                if progress:
                    progress("pgvector HNSW index", 0, count)
                ops = (
                    f"(embedding::halfvec({dim})) halfvec_cosine_ops"
                    if self.store.halfvec
                    else "embedding vector_cosine_ops"
                )
                # pgvector builds fast while the graph fits in memory: about the vectors plus
                # 2m links of 8 bytes per item, with room; at least 1 GB, at most 8 GB.
                need_mb = count * (4 * dim + 2 * _M * 8 + 64) * 1.3 / 2**20
                db.execute(f"SET maintenance_work_mem = '{int(min(max(need_mb, 1024), 8192))}MB'")
                db.execute("SET max_parallel_maintenance_workers = 2")
                db.execute(f"DROP INDEX IF EXISTS {_HNSW}")
                db.execute(
                    f"CREATE INDEX {_HNSW} ON themis_items USING hnsw ({ops}) "
                    f"WITH (m = {_M}, ef_construction = {_EF_CONSTRUCTION})"
                )
                db.execute("RESET maintenance_work_mem")
                db.execute("RESET max_parallel_maintenance_workers")
                built = True
                if progress:
                    progress("pgvector HNSW index", count, count)
            (size,) = db.execute(f"SELECT pg_relation_size('{_HNSW}')").fetchone()
        self.store.set_meta({"search_plan": self._plan(count, int(size or 0)).to_json()})
        return built

    def _plan(self, count: int, hnsw_bytes: int) -> SearchPlan:
        fixed = self.expansion_search
        ef = fixed or ef_search_for(count)
        kind = "halfvec" if self.store.halfvec else "vector"
        how = "fixed" if fixed else f"the rule for {count} rows"
        return SearchPlan(
            kind=SearchKind.PGVECTOR,
            items=count,
            reason=f"pgvector HNSW (m {_M}, {kind}), ef_search {ef} ({how})",
            dtype=GraphDType.F16 if self.store.halfvec else GraphDType.F32,
            connectivity=_M,
            expansion_add=_EF_CONSTRUCTION,
            expansion_search=ef,
            graph_bytes_per_item=hnsw_bytes / count,
            target_recall=self.settings.target_recall,
        )
