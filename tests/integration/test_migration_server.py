"""``POST /admin/migrate`` on a real server: a 2,000-item index moves to another model under
a steady load of searches and writes with no failed request, every answer from one model and
its own index, every write kept; a kill -9 mid-way resumes after a restart without embedding
a committed item again; a rollback restores the old answers exactly."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers import ServerProcess, make_plugin
from tests.migrating import (
    ADMIN,
    TEXTS,
    TOKEN,
    K,
    _Load,
    _model_id,
    _png,
    _search,
    _wait,
    build_library,
)
from themis_clip import ModelConfig, PluginConfig
from themis_clip.collection import Collection
from themis_clip.files import file_lock
from themis_clip.index.search import VectorIndex
from themis_clip.migration import before_path, shadow_path

pytestmark = pytest.mark.slow
ITEMS = 2000


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Path, Path]:
    """2,000 small photos and their index made by model A: ``(folder, index)``."""
    return build_library(tmp_path_factory.mktemp("library"), ITEMS, tiny_model_dir, (36, 28))


@pytest.fixture
def models(tmp_path: Path, tiny_model_dir: Path, tiny_model_dir_b: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(tiny_model_dir, root / "a")
    shutil.copytree(tiny_model_dir_b, root / "b")
    return root


@pytest.fixture
def index(library: tuple[Path, Path], tmp_path: Path) -> Path:
    copy = tmp_path / "photos.db"
    shutil.copy(library[1], copy)
    return copy


def _serve(models: Path, index: Path) -> ServerProcess:
    return ServerProcess(
        ["--model", str(models / "a"), "--model-root", str(models), "--index", str(index)],
        env={"THEMIS_ADMIN_TOKEN": TOKEN},
    )


def _rankings(index: Path, model: Path) -> dict[str, list[str]]:
    """Each text's ranking of the folder's items (written ones left out) by ``model``."""
    config = PluginConfig(model=ModelConfig(path=str(model)))
    with Collection.open(index, config, readonly=True) as collection:
        return {
            text: [
                h.key
                for h in collection.search(text, k=ITEMS + 1000, cut="none")
                if not h.key.startswith("written-")
            ]
            for text in TEXTS
        }


def _consistent(keys: list[str], ranking: list[str]) -> bool:
    """An answer's folder items are the head of that model's ranking over its own index."""
    own = [k for k in keys if not k.startswith("written-")]
    return own == ranking[: len(own)]


def test_a_migration_under_load_loses_nothing_and_answers_from_one_model_and_its_index(
    models: Path, index: Path, tmp_path: Path
) -> None:
    old = _rankings(index, models / "a")
    a_id, b_id = _model_id(models / "a"), _model_id(models / "b")
    with _serve(models, index) as server, httpx.Client(base_url=server.base, timeout=60) as c:
        assert c.get("/admin/migrate", headers=ADMIN).json() == {"state": "idle"}
        with _Load(server.base) as load:
            r = c.post("/admin/migrate", json={"path": "b", "cores": 1}, headers=ADMIN)
            assert r.status_code == 202, r.text
            assert r.json()["state"] == "running" and r.json()["model_id"] == b_id
            again = c.post("/admin/migrate", json={"path": "b"}, headers=ADMIN)
            assert again.status_code == 409, again.text

            # progress shows in /admin/migrate, /stats and /metrics while it runs
            deadline = time.monotonic() + 300
            while (s := c.get("/admin/migrate", headers=ADMIN).json())["done"] < 200:
                assert s["state"] == "running" and time.monotonic() < deadline, s
            assert s["total"] >= ITEMS and s["items_per_s"] > 0 and s["eta_s"] > 0
            stats = c.get("/stats", headers=ADMIN).json()["migration"]
            assert stats["state"] == "running" and stats["done"] >= 200
            metrics = c.get("/metrics", headers=ADMIN).text
            assert 'themis_migration_items{kind="total"}' in metrics
            assert 'themis_migration_state{state="running"} 1.0' in metrics

            # a pause stops the embedding after the chunk in flight; resume goes on
            asked = c.post("/admin/migrate/pause", headers=ADMIN).json()
            assert asked["state"] in ("pausing", "paused")
            paused = _wait(c, ("paused",), timeout_s=60)
            assert paused["embedded"] - asked["embedded"] <= 128  # the chunk in flight at most
            steady = [c.get("/admin/migrate", headers=ADMIN).json() for _ in range(30)]
            assert {s["embedded"] for s in steady} == {paused["embedded"]}
            assert {s["state"] for s in steady} == {"paused"}
            assert c.post("/admin/migrate/resume", headers=ADMIN).json()["state"] == "running"

            done = _wait(c, ("done",))
            # the load goes on across the cut-over until answers by the new pair come in
            deadline = time.monotonic() + 60
            while not any(m == b_id for _, m, _ in load.answers[-5:]):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert load.failures == []
        assert done["missing"] == [] and done["total"] >= ITEMS
        written = list(load.written)
        assert written, "no write went through"
        info = c.get("/index/info", headers=ADMIN).json()
        assert info["model_id"] == b_id and info["server_model_id"] == b_id
        for key in written:  # every write, made before or during the migration, is there
            assert c.get(f"/items/{key}", headers=ADMIN).status_code == 200, key
        before = tmp_path / "before.db"
        shutil.copy(before_path(index, b_id), before)

        new = _rankings(index, models / "b")
        by_model = {a_id: old, b_id: new}
        models_seen = {m for _, m, _ in load.answers}
        assert models_seen == {a_id, b_id}
        wrong = [
            (t, m, keys) for t, m, keys in load.answers if not _consistent(keys, by_model[m][t])
        ]
        assert wrong == [], f"{len(wrong)} of {len(load.answers)} answers mixed a model and index"

        # writes made during the migration have the new model's vectors (of their preview)
        plugin = make_plugin(models / "b")
        try:
            with VectorIndex(index, readonly=True) as migrated:
                for key in written[:: max(1, len(written) // 10)]:
                    n = int(key.split("-")[1])
                    (want,) = plugin.generate_embedding_batch([_png(n)])
                    got = migrated.store.vector(key)
                    assert got is not None and want.embedding is not None
                    assert float(np.dot(got, want.embedding)) > 0.98, key
        finally:
            plugin.shutdown()

        # rollback over HTTP: the old model and the old index answer exactly as before
        rolled = c.post("/admin/migrate/rollback", headers=ADMIN)
        assert rolled.status_code == 200, rolled.text
        assert rolled.json()["state"] == "rolled-back"
        assert isinstance(rolled.json()["lost_by_rollback"], int)
        config = PluginConfig(model=ModelConfig(path=str(models / "a")))
        with Collection.open(before, config, readonly=True) as reference:
            for text in TEXTS:
                got = _search(c, text)
                assert got["model_id"] == a_id
                hits = reference.search(text, k=K, cut="none")
                assert [h["id"] for h in got["results"]] == [h.key for h in hits]
                assert [h["score"] for h in got["results"]] == pytest.approx(
                    [h.score for h in hits], abs=1e-6
                )


def _committed(shadow: Path) -> int:
    with closing(sqlite3.connect(f"file:{shadow}?mode=ro", uri=True)) as db:
        try:
            return int(db.execute("SELECT count(*) FROM items").fetchone()[0])
        except sqlite3.OperationalError:  # no schema yet
            return 0


def test_a_server_killed_mid_migration_resumes_it_after_a_restart(
    models: Path, index: Path
) -> None:
    b_id = _model_id(models / "b")
    shadow = shadow_path(index, b_id)
    server = _serve(models, index)
    try:
        with httpx.Client(base_url=server.base, timeout=60) as c:
            body = {"path": "b", "cores": 1, "cut_over": "command"}
            assert c.post("/admin/migrate", json=body, headers=ADMIN).status_code == 202
            deadline = time.monotonic() + 300
            while not (shadow.is_file() and _committed(shadow) >= 300):
                assert time.monotonic() < deadline
                time.sleep(0.02)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    committed = _committed(shadow)
    assert 300 <= committed < ITEMS

    with _serve(models, index) as server, httpx.Client(base_url=server.base, timeout=60) as c:
        assert c.get("/admin/migrate", headers=ADMIN).json() == {"state": "idle"}
        body = {"path": "b", "cores": 1, "cut_over": "command"}
        assert c.post("/admin/migrate", json=body, headers=ADMIN).status_code == 202
        ready = _wait(c, ("ready",))
        # nothing committed before the kill is embedded again (a chunk may be left for the
        # cut-over, which redoes the last writes with requests held)
        assert ready["embedded"] <= ITEMS - committed
        assert ready["embedded"] >= ITEMS - committed - 128
        assert _search(c, TEXTS[0])["model_id"] != b_id  # the old pair serves until told
        cut = c.post("/admin/migrate/cut-over", headers=ADMIN)
        assert cut.status_code == 200 and cut.json()["state"] == "done", cut.text
        assert _search(c, TEXTS[0])["model_id"] == b_id
    with VectorIndex(index, readonly=True) as migrated:
        assert migrated.store.count() == ITEMS
        assert migrated.stamp is not None and migrated.stamp.model_id == b_id


def test_migrate_refuses_what_it_cannot_do(models: Path, index: Path) -> None:
    with _serve(models, index) as server, httpx.Client(base_url=server.base, timeout=60) as c:
        r = c.post("/admin/migrate", json={"path": "a"}, headers=ADMIN)
        assert r.status_code == 422 and "already" in r.text
        r = c.post("/admin/migrate", json={"path": "../elsewhere"}, headers=ADMIN)
        assert r.status_code == 403
        r = c.post("/admin/migrate", json={"path": "b", "cores": 0}, headers=ADMIN)
        assert r.status_code == 422
        assert c.post("/admin/migrate/pause", headers=ADMIN).status_code == 404
        assert c.post("/admin/migrate", json={"path": "b"}).status_code == 401
        too_many = (os.cpu_count() or 1) + 1
        r = c.post("/admin/migrate", json={"path": "b", "cores": too_many}, headers=ADMIN)
        assert r.status_code == 422 and "cores must be at most" in r.text

        # another migrator holds the shadow (a CLI run): the server's run fails, saying so;
        # a failed migration can be cancelled, which deletes what it left
        shadow = shadow_path(index, _model_id(models / "b"))
        with file_lock(Path(f"{shadow}.lock")):
            r = c.post("/admin/migrate", json={"path": "b", "cores": 1}, headers=ADMIN)
            assert r.status_code == 202, r.text
            failed = _wait(c, ("failed",))
            assert "another migration of this index" in failed["error"]
        cancelled = c.post("/admin/migrate/cancel", headers=ADMIN)
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        r = c.post("/admin/migrate/pause", headers=ADMIN)
        assert r.status_code == 409 and "nothing to pause" in r.text

        body = {"path": "b", "cores": 1, "cut_over": "command"}
        assert c.post("/admin/migrate", json=body, headers=ADMIN).status_code == 202
        assert c.post("/admin/migrate/rollback", headers=ADMIN).status_code == 409
        cancelled = c.post("/admin/migrate/cancel", headers=ADMIN)
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        assert not shadow_path(index, _model_id(models / "b")).exists()
        assert _search(c, TEXTS[0])["model_id"] == _model_id(models / "a")
