from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.helpers import make_plugin
from tests.pg import BUILDS, PgServer, PgServers
from themis_clip import OnnxClipPlugin

try:  # at collection, as before: imported later, beside live threads, onnx crashed a run
    from themis_clip.export.tiny import build_model_dir
except ImportError as exc:  # without onnx only the tests that build a model fail
    NO_EXPORTER: ImportError | None = exc
else:
    NO_EXPORTER = None


# Every model in the suite loads on ONNX Runtime's CPU provider in fp32, whatever CPU runs it: on a
# CPU with bf16 (AMX, AVX-512 BF16), AUTO picks OpenVINO, and the suite's parity floors are CPU fp32's.
# Tests of AUTO itself clear it (the ``auto_backend`` fixture); subprocesses inherit it.
os.environ.setdefault("THEMIS_CLIP_BACKEND", "cpu")
# The commands keep start-up work in $XDG_CACHE_HOME/themis-clip: the suite's go to a folder of its
# own, not the user's (one per run, shared by its tests and their subprocesses).
_CACHE = os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="themis-clip-test-cache-")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture
def auto_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """AUTO as a user gets it: no pin of the backend in the environment."""
    monkeypatch.delenv("THEMIS_CLIP_BACKEND", raising=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long", action="store_true", help="also run the long versions of the stress tests"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # a real PostgreSQL server is the slower set too (still run in CI)
        if "postgres" in item.keywords and "slow" not in item.keywords:
            item.add_marker(pytest.mark.slow)
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long version: run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete model directory: 32 px image tower, text tower, tokenizer, manifest."""
    if NO_EXPORTER is not None:
        raise NO_EXPORTER
    return build_model_dir(tmp_path_factory.mktemp("models") / "tiny", name="tiny-a", seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second model of the same shape with other weights (for hot swap)."""
    if NO_EXPORTER is not None:
        raise NO_EXPORTER
    return build_model_dir(tmp_path_factory.mktemp("models") / "tiny-b", name="tiny-b", seed=7)


@pytest.fixture
def plugin(tiny_model_dir: Path) -> Iterator[OnnxClipPlugin]:
    p = make_plugin(tiny_model_dir)
    yield p
    p.shutdown()


@pytest.fixture(scope="session")
def pg_servers() -> Iterator[PgServers]:
    """Real PostgreSQL + pgvector servers, one per build in ``tests/pg.py``, started on demand
    and stopped at the end of the session."""
    with ExitStack() as stack:
        yield PgServers(stack)


@pytest.fixture(scope="session", params=list(BUILDS))
def pg_server(request: pytest.FixtureRequest, pg_servers: PgServers) -> PgServer:
    """A real server of each build in turn: every test that uses it runs on ``vector``
    (pgvector 0.6) and on ``halfvec`` (0.8)."""
    return pg_servers.get(request.param)


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh database with pgvector enabled, as a connection URL."""
    return pg_server.url(pg_server.new_database())


@pytest.fixture(
    params=[
        "sqlite",
        *(pytest.param(f"postgresql, {build}", marks=pytest.mark.postgres) for build in BUILDS),
    ]
)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An index location of each store in turn, for the suites every store must pass (the store
    contract, queries, duplicates): a SQLite file, or a new database on each PostgreSQL build."""
    if request.param == "sqlite":
        return str(tmp_path / "i.db")
    servers: PgServers = request.getfixturevalue("pg_servers")
    server = servers.get(request.param.split(", ", 1)[1])
    return server.url(server.new_database())
