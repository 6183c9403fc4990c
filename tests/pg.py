"""A real PostgreSQL 16 server with pgvector (the ``pgserver`` wheel), started in a temporary
directory for the test session; each test gets a database of its own.

``THEMIS_TEST_PG_BIN=/path/to/bin`` runs the same tests on another build of the same
PostgreSQL (for instance pgserver's binaries with a newer pgvector compiled into them, to test
``halfvec``: ``make PG_CONFIG=$COPY/bin/pg_config install`` in pgvector's source)."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

_counter = itertools.count()


class PgServer:
    def __init__(self, server: Any, socket_dir: str) -> None:
        self.server = server
        self.socket_dir = socket_dir

    def url(self, database: str = "postgres", user: str = "postgres", password: str = "") -> str:
        auth = user + (f":{quote(password)}" if password else ":")
        return f"postgresql://{auth}@/{database}?host={self.socket_dir}"

    def admin(self, sql: str, *params: object, database: str = "postgres") -> list[Any]:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cur = conn.execute(sql, params or None)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def new_database(self, *, vector: bool = True) -> str:
        name = f"t{next(_counter)}"
        self.admin(f"CREATE DATABASE {name}")
        if vector:
            self.admin("CREATE EXTENSION vector", database=name)
        return name


@contextmanager
def running_server() -> Iterator[PgServer]:
    pgserver = pytest.importorskip("pgserver")
    other = os.environ.get("THEMIS_TEST_PG_BIN")
    if other:  # pgserver looks its binaries up in these module globals at each call
        import pgserver._commands
        import pgserver.postgres_server

        pgserver._commands.POSTGRES_BIN_PATH = Path(other)
        pgserver.postgres_server.POSTGRES_BIN_PATH = Path(other)
    # A short path: the server's Unix socket lives there (sun_path holds 107 bytes).
    with tempfile.TemporaryDirectory(prefix="pg", dir="/tmp") as tmp:
        server = pgserver.get_server(tmp, cleanup_mode="stop")
        try:
            yield PgServer(server, tmp)
        finally:
            server.cleanup()
