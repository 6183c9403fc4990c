"""Moving a PostgreSQL index to another model, on both PostgreSQL builds: the shadow is a
schema of its own beside the live one, a kill -9 mid-way resumes without embedding a
committed item again, writes made during the migration are in the migrated index, the
cut-over swaps the tables in one transaction and a rollback restores the old answers exactly."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.helpers import ServerProcess, photo_like
from tests.migrating import (
    _SLOW_MIGRATION,
    ADMIN,
    TOKEN,
    _config,
    _Counting,
    _Load,
    _model_id,
    _search,
    _wait,
    kill_when,
)
from tests.pg import PgServer
from themis_clip.cli import main
from themis_clip.collection import Collection, Query
from themis_clip.errors import IndexModelMismatchError
from themis_clip.index.search import VectorIndex
from themis_clip.index.settings import SearchKind
from themis_clip.index.stores import ItemRow
from themis_clip.migration import migrate_index

pytestmark = pytest.mark.postgres

ITEMS = 60


def _answers(url: str, model: Path, probe: Path) -> list[list[tuple[str, float]]]:
    with Collection.open(url, _config(model), readonly=True) as collection:
        return [
            [(h.key, h.score) for h in collection.search(q, k=ITEMS + 5, cut="none")]
            for q in (Query(text="a photo of a dog"), Query(image=str(probe)))
        ]


def _schemas(server: PgServer, url: str, like: str) -> list[str]:
    database = url.split("/")[3].split("?")[0]
    rows = server.admin(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", like, database=database
    )
    return sorted(r[0] for r in rows)


def _committed(server: PgServer, url: str) -> set[str]:
    database = url.split("/")[3].split("?")[0]
    shadows = _schemas(server, url, "public.migrating-%")
    if not shadows:
        return set()
    rows = server.admin(
        "SELECT to_regclass(format('%%I.themis_items', %s::text))", shadows[0], database=database
    )
    if rows[0][0] is None:
        return set()
    table = '"' + shadows[0] + '".themis_items'
    return {r[0] for r in server.admin(f"SELECT key FROM {table}", database=database)}


@pytest.mark.slow
def test_a_postgresql_index_migrates_resumes_after_kill_keeps_writes_and_rolls_back_exactly(
    pg_server: PgServer,
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(ITEMS):
        Image.fromarray(photo_like(40, 30, i)).save(photos / f"{i:03d}.png")
    url = pg_server.url(pg_server.new_database())
    with Collection.open(url, _config(tiny_model_dir)) as collection:
        collection.index_folder(photos)
    probe = photos / "017.png"
    old = _answers(url, tiny_model_dir, probe)

    # kill -9 a slow migration once it has committed some chunks
    argv = ["migrate", "--index", url, "--to", str(tiny_model_dir_b), "--threads", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SLOW_MIGRATION), *argv, "--batch-size", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    kill_when(proc, lambda: len(_committed(pg_server, url)) >= 16)
    committed = _committed(pg_server, url)
    assert 16 <= len(committed) < ITEMS
    assert _schemas(pg_server, url, "public.before-%") == []  # not cut over
    assert _answers(url, tiny_model_dir, probe) == old  # the live index is untouched

    # writes during the migration: one item deleted, one added (its file kept)
    extra = tmp_path / "extra.png"
    Image.fromarray(photo_like(40, 30, 999)).save(extra)
    gone = str(photos / "003.png")
    assert gone in committed
    with VectorIndex(url) as live:
        assert live.stamp is not None
        vector = live.store.vectors_by_id([1], live.stamp.dim)[0]
        live.store.upsert(
            [ItemRow(key=str(extra), path=str(extra), vector=vector)], dim=live.stamp.dim
        )
        assert live.store.delete_keys([gone]) == 1
    at_cut = _answers(url, tiny_model_dir, probe)

    stale = VectorIndex(url)  # another process's index, bound to the old model
    assert stale.stamp is not None
    stale.bind_model(stale.stamp)
    counting = _Counting(tiny_model_dir_b)
    identity = counting.plugin.model_identity
    assert identity is not None
    try:
        report = migrate_index(url, counting, identity, chunk=8)
    finally:
        counting.plugin.shutdown()
    # its write, checked against the old model before the cut-over, lands after it: refused
    with stale, pytest.raises(IndexModelMismatchError, match=identity.model_id):
        stale.store.upsert([ItemRow(key="stale", vector=vector)], dim=identity.dim)
    assert not set(counting.seen) & committed  # nothing committed is embedded twice
    assert str(extra) in counting.seen
    assert report.before is not None and report.removed == 1
    assert _schemas(pg_server, url, "public.migrating-%") == []
    with VectorIndex(url, readonly=True) as migrated:
        assert migrated.stamp == identity
        assert migrated.store.count() == ITEMS
        assert migrated.store.get(str(extra)) is not None and migrated.store.get(gone) is None
        assert migrated.searcher.mode == SearchKind.PGVECTOR  # its HNSW index came along

    # the independent reference: the same items indexed afresh by model B
    os.replace(extra, photos / "extra.png")
    reference = pg_server.url(pg_server.new_database())
    with Collection.open(reference, _config(tiny_model_dir_b)) as collection:
        (photos / "003.png").unlink()
        collection.index_folder(photos)
    os.replace(photos / "extra.png", extra)
    want = _answers(reference, tiny_model_dir_b, probe)
    got = _answers(url, tiny_model_dir_b, probe)
    for g, w in zip(got, want, strict=True):
        assert [s for _, s in g] == pytest.approx([s for _, s in w], abs=1e-5)
        assert [Path(k).name for k, _ in g] == [Path(k).name for k, _ in w]

    assert main(["migrate", "--index", url, "--rollback"]) == 0
    out = capsys.readouterr().out
    assert "rolled back" in out
    assert _answers(url, tiny_model_dir, probe) == at_cut  # exactly: the very same tables
    assert _schemas(pg_server, url, "public.before-%") == []
    assert main([*argv]) == 0  # the replaced index is the shadow again: nothing to embed
    assert "0 embedded now" in capsys.readouterr().out
    assert main(["migrate", "--index", url, "--rollback"]) == 0
    capsys.readouterr()


@pytest.mark.slow
def test_two_servers_on_one_postgresql_index_across_a_migration_by_one_of_them(
    pg_server: PgServer, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    """The migrating server loses no request or write under load; the other one, still on
    the old model, refuses model searches and writes with a 409 naming the index's new model
    (never mixing the two) until it is reloaded with that model."""
    models = tmp_path / "models"
    shutil.copytree(tiny_model_dir, models / "a")
    shutil.copytree(tiny_model_dir_b, models / "b")
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(ITEMS):
        Image.fromarray(photo_like(40, 30, i)).save(photos / f"{i:03d}.png")
    url = pg_server.url(pg_server.new_database())
    with Collection.open(url, _config(models / "a")) as collection:
        collection.index_folder(photos)
    b_id = _model_id(models / "b")
    args = ["--model", str(models / "a"), "--model-root", str(models), "--index", url]
    env = {"THEMIS_ADMIN_TOKEN": TOKEN}
    with (
        ServerProcess(args, env=env) as one,
        ServerProcess(args, env=env) as two,
        httpx.Client(base_url=one.base, timeout=60) as c1,
        httpx.Client(base_url=two.base, timeout=60) as c2,
    ):
        with _Load(one.base) as load:
            r = c1.post("/admin/migrate", json={"path": "b", "cores": 1}, headers=ADMIN)
            assert r.status_code == 202, r.text
            _wait(c1, ("done",))
        assert load.failures == [] and load.written
        for key in load.written:  # writes made during the migration are in the new index
            assert c1.get(f"/items/{key}", headers=ADMIN).status_code == 200, key
        assert _search(c1, "a photo of a dog")["model_id"] == b_id
        assert _schemas(pg_server, url, "public.before-%") != []

        query = {"text": "a photo of a dog", "k": 5, "cut": "none"}
        r = c2.post("/search", json=query, headers=ADMIN)
        assert r.status_code == 409 and b_id in r.json()["error"]["message"], r.text
        image = base64.b64encode((photos / "001.png").read_bytes()).decode()
        write = {"items": [{"id": "from-two", "image": image}]}
        r = c2.post("/index/items", json=write, headers=ADMIN)
        assert r.status_code == 409 and b_id in r.text, r.text
        assert c1.get("/items/from-two", headers=ADMIN).status_code == 404  # nothing mixed in
        lexical = {"text": "001", "mode": "lexical", "k": 5, "cut": "none"}
        assert c2.post("/search", json=lexical, headers=ADMIN).status_code == 200
        by_item = {"item": str(photos / "001.png"), "k": 5, "cut": "none"}  # the index's vector
        r = c2.post("/search", json=by_item, headers=ADMIN)
        assert r.status_code == 200, r.text

        r = c2.post("/admin/reload", json={"path": "b"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert _search(c2, "a photo of a dog") == _search(c1, "a photo of a dog")

        # the migrating server rolls back; a migration started again and cancelled drops its
        # shadow schema
        r = c1.post("/admin/migrate/rollback", headers=ADMIN)
        assert r.status_code == 200 and r.json()["state"] == "rolled-back", r.text
        assert _schemas(pg_server, url, "public.before-%") == []
        assert len(_schemas(pg_server, url, "public.migrating-%")) == 1
        body = {"path": "b", "cores": 1, "cut_over": "command"}
        assert c1.post("/admin/migrate", json=body, headers=ADMIN).status_code == 202
        _wait(c1, ("ready",))
        cancelled = c1.post("/admin/migrate/cancel", headers=ADMIN)
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        assert _schemas(pg_server, url, "public.migrating-%") == []
        assert _search(c1, "a photo of a dog")["model_id"] != b_id


def test_a_collection_in_its_own_schema_migrates_alone(
    pg_server: PgServer,
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two collections in one database (``public`` and a schema named by the URL's search
    path): migrating one moves its tables only, beside it; the other answers as before."""
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(8):
        Image.fromarray(photo_like(40, 30, i)).save(photos / f"{i}.png")
    database = pg_server.new_database()
    pg_server.admin("CREATE SCHEMA coll", database=database)
    other = pg_server.url(database)
    url = other + "&options=-csearch_path%3Dcoll,public"
    for location in (other, url):
        with Collection.open(location, _config(tiny_model_dir)) as collection:
            collection.index_folder(photos)
    probe = photos / "3.png"
    untouched = _answers(other, tiny_model_dir, probe)

    argv = ["migrate", "--index", url, "--to", str(tiny_model_dir_b), "--threads", "1"]
    assert main(argv) == 0
    assert "the previous index kept as coll.before-" in capsys.readouterr().out
    assert _schemas(pg_server, other, "coll.%") == [f"coll.before-{_model_id(tiny_model_dir_b)}"]
    assert _schemas(pg_server, other, "public.%") == []
    with VectorIndex(url, readonly=True) as migrated:
        assert migrated.stamp is not None
        assert migrated.stamp.model_id == _model_id(tiny_model_dir_b)
        assert migrated.store.count() == 8
    assert _answers(other, tiny_model_dir, probe) == untouched

    assert main(["migrate", "--index", url, "--rollback"]) == 0
    with VectorIndex(url, readonly=True) as restored:
        assert restored.stamp is not None
        assert restored.stamp.model_id == _model_id(tiny_model_dir)
    assert _answers(other, tiny_model_dir, probe) == untouched
