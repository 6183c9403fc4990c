"""What only the PostgreSQL store does: connection and extension errors, pgvector's HNSW index
with ``ef_search`` from a rule, and the URL in messages without its password."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fakes import clustered
from tests.pg import PgServer
from themis_clip import SearchIndexError
from themis_clip.index.search import VectorIndex
from themis_clip.index.searchers.postgres import ef_search_for
from themis_clip.index.stores import ItemRow
from themis_clip.index.stores.postgres import PgStore, redact
from themis_clip.vocabulary import ModelIdentity

pytestmark = pytest.mark.postgres


def test_unreachable_and_unauthorised_servers_are_clear_errors(pg_server: PgServer) -> None:
    with pytest.raises(SearchIndexError, match="cannot connect to PostgreSQL at"):
        VectorIndex("postgresql://postgres@/postgres?host=/nonexistent-dir")
    with pytest.raises(SearchIndexError, match="cannot connect to PostgreSQL at .*refused"):
        VectorIndex("postgresql://postgres:secret@127.0.0.1:1/postgres?connect_timeout=3")
    with pytest.raises(SearchIndexError, match='role "nobody" does not exist'):
        VectorIndex(pg_server.url(user="nobody"))
    pg_server.admin("CREATE ROLE locked NOLOGIN")
    with pytest.raises(SearchIndexError, match="not permitted to log in"):
        VectorIndex(pg_server.url(user="locked"))
    # A role that may log in but not read the index someone else created.
    database = pg_server.new_database()
    VectorIndex(pg_server.url(database)).close()
    pg_server.admin("CREATE ROLE reader LOGIN")
    with pytest.raises(SearchIndexError, match="permission denied"):
        VectorIndex(pg_server.url(database, user="reader"))


def test_a_database_without_pgvector_is_a_clear_error(pg_server: PgServer) -> None:
    database = pg_server.new_database(vector=False)
    pg_server.admin("CREATE ROLE owner LOGIN")
    pg_server.admin(f"ALTER DATABASE {database} OWNER TO owner")
    # pgvector is not a trusted extension: only a superuser can enable it.
    with pytest.raises(SearchIndexError, match="no pgvector extension enabled.*superuser"):
        VectorIndex(pg_server.url(database, user="owner"))
    with pytest.raises(SearchIndexError, match="read-only"):
        VectorIndex(pg_server.url(database, user="owner"), readonly=True)
    # Nothing half-made: once a superuser enables it, the owner opens a fresh index.
    pg_server.admin("CREATE EXTENSION vector", database=database)
    with VectorIndex(pg_server.url(database, user="owner")) as index:
        assert index.store.count() == 0


def test_a_superuser_enables_pgvector_itself(pg_server: PgServer) -> None:
    url = pg_server.url(pg_server.new_database(vector=False))
    with VectorIndex(url) as index:
        assert isinstance(index.store, PgStore)
        available = pg_server.admin(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
        )[0][0]
        assert index.store.extension_version == available  # 0.6.2 from pgserver
        major_minor = tuple(int(p) for p in available.split(".")[:2])
        assert index.store.halfvec is (major_minor >= (0, 7))  # halfvec came in 0.7


def test_read_only_on_an_empty_database_says_what_to_do(pg_url: str) -> None:
    with pytest.raises(SearchIndexError, match="needs a migration; open it writable once"):
        VectorIndex(pg_url, readonly=True)


def test_passwords_stay_out_of_messages() -> None:
    assert redact("postgresql://u:hunter2@db:5432/x") == "postgresql://u:***@db:5432/x"
    with pytest.raises(SearchIndexError) as info:
        VectorIndex("postgresql://u:hunter2@127.0.0.1:1/x?connect_timeout=3")
    assert "hunter2" not in str(info.value)


def test_prepare_builds_the_hnsw_index_and_records_ef_search(pg_url: str) -> None:
    rng = np.random.default_rng(0)
    both = clustered(rng, 5_100)
    data, queries = both[:5_000], both[5_000:]
    with VectorIndex(pg_url) as index:
        index.bind_model(ModelIdentity.from_model_id("t@1", sha256="ab" * 32, dim=64))
        for start in range(0, 5_000, 1_000):
            index.store.upsert(
                [ItemRow(key=str(i), vector=data[i]) for i in range(start, start + 1_000)], dim=64
            )
        assert index.mode == "exact"  # no HNSW index yet: exact scans
        assert index.prepare_graph() is True and index.mode == "pgvector"
        plan = index.plan
        assert plan is not None and plan.kind == "pgvector"
        assert plan.expansion_search == ef_search_for(5_000)
        stats = index.stats()
        assert stats["store"] == "postgresql" and stats["store_bytes_per_item"] > 64 * 4
        recalls = []
        for q in queries:
            got = {int(h.key) for h in index.search(q, 10)}
            recalls.append(len(got & set(np.argsort(-(data @ q))[:10].tolist())) / 10)
        assert np.mean(recalls) >= 0.95
        # More than an HNSW scan returns (ef_search <= 1000): an exact scan, all of them.
        assert len(index.search(queries[0], 1_500)) == 1_500
        assert index.prepare_graph() is False  # the index exists: the plan recorded again
    with VectorIndex(pg_url, readonly=True) as ro:  # another process's view of the same plan
        assert ro.mode == "pgvector" and ro.search(data[3], 1)[0].key == "3"


def test_the_hnsw_index_holds_halfvec_where_pgvector_has_it_and_scores_stay_exact(
    pg_url: str,
) -> None:
    import psycopg

    rng = np.random.default_rng(1)
    both = clustered(rng, 2_050)
    data, queries = both[:2_000], both[2_000:]
    with VectorIndex(pg_url) as index:
        index.bind_model(ModelIdentity.from_model_id("t@1", sha256="ab" * 32, dim=64))
        index.store.upsert([ItemRow(key=str(i), vector=data[i]) for i in range(2_000)], dim=64)
        assert index.prepare_graph() is True
        halfvec = index.store.halfvec
        for q in queries:
            hits = index.search(q, 10)
            exact = data[[int(h.key) for h in hits]] @ q
            # halfvec candidates are re-scored from the float32 column: exact cosines.
            assert np.allclose([h.score for h in hits], exact, atol=1e-5)
    with psycopg.connect(pg_url) as conn:
        (definition,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'themis_items_hnsw'"
        ).fetchone() or ("",)
        assert ("halfvec_cosine_ops" in definition) is halfvec
        assert ("vector_cosine_ops" in definition) is not halfvec
        if halfvec:  # the query the store runs is answered by that index
            conn.execute("SET enable_seqscan = off")
            plan = conn.execute(
                "EXPLAIN SELECT id FROM themis_items "
                "ORDER BY embedding::halfvec(64) <=> %s::halfvec(64) LIMIT 30",
                (str(queries[0].tolist()),),
            ).fetchall()
            assert "themis_items_hnsw" in " ".join(r[0] for r in plan)


def test_readers_do_not_queue_behind_one_connection(pg_url: str) -> None:
    """Issue 28, 2.3: one connection behind one lock made every search wait for the one
    before it. A thread holding a connection must not stop another thread's query."""
    import threading

    with PgStore(pg_url) as store:
        entered, release, done = threading.Event(), threading.Event(), threading.Event()

        def hold() -> None:
            with store.connection() as db:
                db.execute("SELECT 1")
                entered.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert entered.wait(10)
            counted: list[int] = []

            def count() -> None:
                counted.append(store.count())
                done.set()

            threading.Thread(target=count, daemon=True).start()
            assert done.wait(10), "a query waited for another thread's connection"
            assert counted == [0]
        finally:
            release.set()
            holder.join(10)


def test_integrity_ok_notices_tables_that_disagree(pg_url: str) -> None:
    """It was ``count(*) >= 0``, never false. Each check, broken on purpose, makes it false."""
    with VectorIndex(pg_url) as index:
        index.bind_model(ModelIdentity.from_model_id("t@1", sha256="ab" * 32, dim=4))
        index.store.upsert(
            [ItemRow(key=str(i), vector=np.eye(4, dtype=np.float32)[i]) for i in range(4)], dim=4
        )
        store = index.store
        assert isinstance(store, PgStore) and store.integrity_ok()
        breaks = [
            "INSERT INTO themis_removed(id, at) SELECT min(id), 1 FROM themis_items",
            "UPDATE themis_items SET written = written + 1000 WHERE key = '1'",
            "UPDATE themis_items SET doc = '{}'::jsonb WHERE key = '2'",
            "DELETE FROM themis_meta WHERE key = 'write_version'",
        ]
        for sql in breaks:
            with store.connection() as db, db.transaction():
                db.execute("SAVEPOINT broken")
                db.execute(sql)
                assert not store.integrity_ok(), sql  # the same connection sees its change
                db.execute("ROLLBACK TO SAVEPOINT broken")
        assert store.integrity_ok()
