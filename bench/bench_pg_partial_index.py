"""What a partial HNSW index costs a query (issue 30 item 5): one table of 30k × 512 unit
vectors three times over, indexed (m 16, ef_construction 64) with the 400-id literal predicate
the store uses (`a`), without a predicate (`b`), and on a boolean column (`c`); 300 queries each,
unprepared and prepared, five passes taken in turn. Prints each pass's p50.

Run: flock /tmp/themis-bench.lock .venv/bin/python bench/bench_pg_partial_index.py
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import psycopg
from pgvector.psycopg import register_vector

from tests.pg import running_server

with running_server("pgvector 0.6") as server:
    db = server.new_database()
    with psycopg.connect(server.url(db), autocommit=True) as c:
        register_vector(c)
        rng = np.random.default_rng(0)
        X = rng.standard_normal((30000, 512)).astype(np.float32)
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        held = sorted(rng.choice(30000, 400, replace=False).tolist())
        hs = set(held)
        for t in ["a", "b", "c"]:
            c.execute(
                f"CREATE TABLE {t} (id bigint primary key, embedding vector(512), held boolean not null default false)"
            )
            with c.cursor().copy(
                f"COPY {t} (id, embedding, held) FROM STDIN WITH (FORMAT BINARY)"
            ) as cp:
                cp.set_types(["int8", "vector", "bool"])
                for i, v in enumerate(X):
                    cp.write_row((i, v, i in hs))
        arr = "'{" + ",".join(map(str, held)) + "}'::bigint[]"
        c.execute("SET maintenance_work_mem='1GB'")
        c.execute(
            f"CREATE INDEX ha ON a USING hnsw (embedding vector_cosine_ops) WITH (m=16, ef_construction=64) WHERE id <> ALL ({arr})"
        )
        c.execute(
            "CREATE INDEX hb ON b USING hnsw (embedding vector_cosine_ops) WITH (m=16, ef_construction=64)"
        )
        c.execute(
            "CREATE INDEX hc ON c USING hnsw (embedding vector_cosine_ops) WITH (m=16, ef_construction=64) WHERE NOT held"
        )
        for t in "abc":
            c.execute(f"ANALYZE {t}")
        Q = X[:300] + 0.01
        sqls = {
            "literal": f"SELECT id, 1-(embedding <=> %s) FROM a WHERE id <> ALL ({arr}) ORDER BY embedding <=> %s LIMIT 10",
            "full": "SELECT id, 1-(embedding <=> %s) FROM b ORDER BY embedding <=> %s LIMIT 10",
            "column": "SELECT id, 1-(embedding <=> %s) FROM c WHERE NOT held ORDER BY embedding <=> %s LIMIT 10",
        }
        res = {k: [] for k in sqls}
        for _ in range(5):
            for name in sqls:
                for prep in [False, True]:
                    ts = []
                    for q in Q:
                        t0 = time.perf_counter()
                        c.execute(sqls[name], (q, q), prepare=prep).fetchall()
                        ts.append(time.perf_counter() - t0)
                    res[name].append((prep, np.median(ts) * 1000))
        for name, v in res.items():
            for prep in [False, True]:
                print(
                    name,
                    "prepared" if prep else "unprepared",
                    " ".join(f"{m:.3f}" for p, m in v if p == prep),
                )
