"""``where`` over HTTP (``/search``) and the CLI (``search --where``): filtered results, and
bad filters refused naming their path."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from themis_clip import PluginConfig
from themis_clip.cli import main
from themis_clip.server.app import create_app
from themis_clip.server.settings import ServerSettings

# Each test starts real processes (a `themis-clip serve`, a Hub stand-in): the slower set.
pytestmark = pytest.mark.slow


def data_url(seed: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (seed * 40 % 256, 90, 200)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_search_where_filters_and_names_bad_paths(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = PluginConfig.from_dict({"model": {"path": str(tiny_model_dir)}})
    app = create_app(ServerSettings(plugin_config=config, index_path=str(tmp_path / "i.db")))
    metadata = [
        {"taken": "2023-07-14T18:03:11+02:00", "camera": {"make": "Canon"}},
        {"taken": "2023-08-01", "camera": {"make": "NIKON"}, "gps": {"lat": -33.9, "lon": 151.2}},
        {"camera": {"make": "Canon"}},
    ]
    items = [{"id": f"p{i}", "image": data_url(i), "metadata": m} for i, m in enumerate(metadata)]
    with TestClient(app) as client:
        assert client.post("/index/items", json={"items": items}).status_code == 200

        def ids(where: object, **query: object) -> set[str]:
            body = {"k": 10, "where": where, "cut": "none", **(query or {"text": "a photo"})}
            r = client.post("/search", json=body)
            assert r.status_code == 200, r.text
            return {hit["id"] for hit in r.json()["results"]}

        assert ids({"taken": {"$gte": "2023-07-14", "$lt": "2023-07-15"}}) == {"p0"}
        assert ids({"camera.make": "Canon"}) == {"p0", "p2"}
        assert ids({"gps": {"$near": {"lat": -33.86, "lon": 151.21, "km": 20}}}) == {"p1"}
        assert ids({"taken": {"$exists": False}}) == {"p2"}
        assert ids({"camera.make": "Canon"}, item="p0") == {"p2"}  # more like this (not p0 itself)
        got = client.post(
            "/search", json={"text": "x", "where": {"$or": [{"n": 1}, {"taken": {"$gt": "soon"}}]}}
        )
        assert got.status_code == 422
        assert "where.$or[1].taken.$gt" in got.json()["error"]["message"]
        bad = client.post("/search", json={"text": "x", "where": {"n": {"$regex": "a"}}})
        assert bad.status_code == 422 and "where.n.$regex" in bad.json()["error"]["message"]
        # Hostile paths and dates are 422s naming the problem, never a 500 (found by a tryout).
        hostile = [
            ('{"a\\u0000b": 1}', "NUL"),  # SQLite's JSON paths cannot hold it
            ('{"\\ud800": 1}', "not valid Unicode"),  # a lone surrogate: orjson's 400
            ('{"\\ud800.a": {"$exists": false}}', "not valid Unicode"),
            ('{"taken": {"$gt": "0001-01-01T00:00:00+01:00"}}', "ISO 8601"),  # before year 1
            ('{"taken": {"$gt": "9999-12-31T23:59:59-01:00"}}', "ISO 8601"),  # after 9999
            ('{"gps": {"$near": {"lat": 1, "lon": 2, "km": 1e400}}}', "infinity"),  # orjson
        ]
        for where, problem in hostile:
            r = client.post(
                "/search",
                content=f'{{"text": "x", "where": {where}}}'.encode(),
                headers={"content-type": "application/json"},
            )
            status = 400 if "ud800" in where or "1e400" in where else 422  # the parser's
            assert r.status_code == status, (where, r.text)
            assert problem in r.json()["error"]["message"], (where, r.text)
        ops = client.post("/search", json={"text": "x", "filters": {"name": {"$gt": 1}}})
        assert ops.status_code == 422 and 'use "where"' in ops.json()["error"]["message"]
        long = client.post("/search", json={"text": "x", "where": {"$" + "x" * 100_000: 1}})
        assert long.status_code == 422 and len(long.text) < 1000  # the key is not echoed whole


def test_cli_where_is_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "none.db")
    with pytest.raises(SystemExit) as caught:
        main(["search", "x", "--index", db, "--where", '{"taken": {"$gte": "nope"}}'])
    assert caught.value.code == 2
    assert "where.taken.$gte" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["search", "x", "--index", db, "--where", "{not json"])
    assert "not JSON" in capsys.readouterr().err
    for where, problem in (
        ('{"$and": [' * 5000 + "{}" + "]}" * 5000, "nested deeper"),  # no RecursionError
        ('{"a": 1, "a": 2}', "duplicate key"),
        ('{"camera.ma\\u0000ke": "Canon"}', "NUL"),
        ('{"taken": {"$gt": "0001-01-01T00:00:00+01:00"}}', "where.taken.$gt"),
    ):
        with pytest.raises(SystemExit) as caught:
            main(["search", "x", "--index", db, "--where", where])
        assert caught.value.code == 2 and problem in capsys.readouterr().err, where
    with pytest.raises(SystemExit) as caught:
        main(["search", "x", "--index", db, "--where", '{"a": 1}', "--where", '{"b": 2}'])
    assert caught.value.code == 2 and "given twice" in capsys.readouterr().err
