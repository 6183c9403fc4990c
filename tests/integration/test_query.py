"""Query arithmetic, paging and hybrid search through the real server (``themis-clip serve``
subprocesses on SQLite and both PostgreSQL builds) and the real CLI, with the demo model."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import ServerProcess, encode, photo_like
from tests.pg import BUILDS, PgServers
from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
from themis_clip.config import ModelConfig

# Each test starts real processes (a `themis-clip serve`, a Hub stand-in): the slower set.
pytestmark = pytest.mark.slow

N = 24
CAPTIONS = {13: "a lighthouse at dusk", 5: "birthday cake"}
EXE = str(Path(sys.executable).parent / "themis-clip")


def png(seed: int) -> bytes:
    return encode(Image.fromarray(photo_like(48, 40, seed)), "PNG")


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def key(i: int) -> str:
    return f"photos/IMG_{4700 + i}.jpg"


def unit(v: Any) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


@pytest.fixture(
    scope="module",
    params=[
        "sqlite",
        *(pytest.param(f"postgresql, {build}", marks=pytest.mark.postgres) for build in BUILDS),
    ],
)
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    if request.param == "sqlite":
        location = str(tmp_path_factory.mktemp("idx") / "i.db")
    else:
        servers: PgServers = request.getfixturevalue("pg_servers")
        pg = servers.get(request.param.split(", ", 1)[1])
        location = pg.url(pg.new_database())
    with (
        ServerProcess(["--model", str(demo_model_path()), "--index", location]) as server,
        httpx.Client(base_url=server.base, timeout=120) as c,
    ):
        items = [
            {
                "id": key(i),
                "image": data_url(png(i)),
                "metadata": {
                    "group": i % 2,
                    "caption": CAPTIONS.get(i, f"photo number {i}"),
                    "taken": f"20{10 + i:02d}-06-01T10:00:00" if i % 3 else None,
                },
            }
            for i in range(N)
        ]
        assert c.post("/index/items", json={"items": items}).status_code == 200
        yield c


def search(c: httpx.Client, **body: Any) -> dict[str, Any]:
    body.setdefault("cut", "none")  # these tests are about ranking and paging, not the cut
    r = c.post("/search", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def error(c: httpx.Client, status: int, **body: Any) -> str:
    r = c.post("/search", json=body)
    assert r.status_code == status, r.text
    return r.json()["error"]["message"]  # type: ignore[no-any-return]


def test_arithmetic_ranks_as_the_models_own_vectors_say(client: httpx.Client) -> None:
    c = client
    images = np.array(
        [c.post("/embed/image", content=png(i)).json()["embedding"] for i in range(N)]
    )
    texts = c.post("/embed/text", json={"texts": ["a red circle", "a blue square"]}).json()
    red, blue = (np.asarray(v) for v in texts["embeddings"])
    parts = [(red, 1.0), (images[3], 0.5), (images[5], 1.0), (blue, -1.0), (images[8], 0.7)]
    q = unit(sum(w * unit(v) for v, w in parts))
    scores = unit_rows(images) @ q
    # An item the query is made of is no answer to it ("more like this" leaves it out).
    order = [int(i) for i in np.argsort(-scores) if int(i) != 5][:10]
    expected = [key(i) for i in order]
    got = search(
        c,
        k=10,
        query=[
            {"text": "a red circle"},
            {"image": data_url(png(3)), "weight": 0.5},
            {"item": key(5)},
            {"text": "a blue square", "weight": -1},
            {"vector": (9 * images[8]).tolist(), "weight": 0.7},  # normalised first
        ],
    )
    assert [r["id"] for r in got["results"]] == expected
    assert [r["score"] for r in got["results"]] == pytest.approx(
        [float(scores[i]) for i in order], abs=1e-4
    )
    # One part alone is the plain query; a vector part is used as given.
    single = search(c, k=5, query=[{"text": "a red circle"}])
    assert [r["id"] for r in single["results"]] == [
        r["id"] for r in search(c, k=5, text="a red circle")["results"]
    ]
    by_vector = search(c, k=3, query=[{"vector": q.tolist()}])  # no item part: none left out
    assert [r["id"] for r in by_vector["results"]] == [key(int(i)) for i in np.argsort(-scores)[:3]]
    assert "cancel out" in error(c, 422, query=[{"text": "x"}, {"text": "x", "weight": -1}])
    assert "exactly one" in error(c, 422, query=[{"text": "x", "item": key(1)}])
    assert "not both" in error(c, 422, text="x", query=[{"text": "y"}])
    assert error(c, 404, query=[{"text": "x"}, {"item": "nope"}])
    assert "weight" in error(c, 422, query=[{"text": "x", "weight": 0}])
    assert error(c, 422, query=[])
    assert "components" in error(c, 422, query=[{"text": "x"}, {"vector": [1.0, 2.0]}])
    # Huge float32 components are fine (their norm overflowed float32: a 422 before) ...
    huge = search(c, k=3, query=[{"vector": (q * 1e37).tolist()}])
    assert [r["id"] for r in huge["results"]] == [r["id"] for r in by_vector["results"]]
    # ... and what float32 cannot hold is named as such.
    assert "finite 32-bit" in error(c, 422, vector=[1e200] * len(q))
    assert "round to zero" in error(c, 422, vector=[1e-200] * len(q))


def unit_rows(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=1, keepdims=True)


@pytest.mark.parametrize("mode", ["vector", "hybrid"])
def test_pages_concatenated_equal_one_query(client: httpx.Client, mode: str) -> None:
    for filters in (None, {"group": 1}):
        body: dict[str, Any] = {"text": "photo", "mode": mode, "filters": filters, "cut": "none"}
        whole = search(client, k=9, **body)
        pages: list[str] = []
        cursor = None
        for _ in range(3):
            page = search(client, k=3, cursor=cursor, **body)
            pages += [r["id"] for r in page["results"]]
            cursor = page["next"]
            assert cursor is not None
        assert pages == [r["id"] for r in whole["results"]] and len(set(pages)) == 9
        rest = search(client, k=100, cursor=cursor, **body)
        total = N // 2 if filters else N
        assert len(rest["results"]) == total - 9 and rest["next"] is None
        assert not set(pages) & {r["id"] for r in rest["results"]}


def test_bad_cursors_are_422_and_name_the_problem(client: httpx.Client) -> None:
    first = search(client, k=2, text="photo")
    cursor = first["next"]
    for forged in ("", "garbage", cursor[:-3], cursor[::-1], "A" * 4000):
        r = client.post("/search", json={"k": 2, "text": "photo", "cursor": forged})
        assert r.status_code == 422 and "cursor" in r.json()["error"]["message"], forged
    for other in (
        {"text": "a dog"},
        {"text": "photo", "mode": "hybrid"},
        {"text": "photo", "filters": {"group": 0}},
    ):
        message = error(client, 422, k=2, cursor=cursor, **other)
        assert "another query" in message
    assert client.post("/search", json={"k": 2, "text": "photo", "cursor": 5}).status_code == 422


def test_hybrid_finds_file_names_and_caption_words_first(client: httpx.Client) -> None:
    for words, expected in (("IMG_4711", key(11)), ("lighthouse", key(13)), ("cake", key(5))):
        hybrid = search(client, k=5, text=words, mode="hybrid")
        assert hybrid["results"][0]["id"] == expected, words
        assert len(hybrid["results"]) == 5  # the vector ranks fill the rest
        lexical = search(client, k=5, text=words, mode="lexical")
        assert [r["id"] for r in lexical["results"]] == [expected]
        assert lexical["next"] is None
    filtered = search(client, k=5, text="lighthouse", mode="lexical", filters={"group": 0})
    assert filtered["results"] == []
    assert "text part" in error(client, 422, item=key(1), mode="lexical")
    assert error(client, 422, text="x", mode="fuzzy")
    for mode in ("hybrid", "lexical"):  # refused before any store sees it
        assert "NUL" in error(client, 422, text="bu\u0000cks", mode=mode)
    # Several text parts: the first one's words are matched (as the CLI's TEXT with --add);
    # the others shape only the vector, so "IMG_4711" still finds its file first.
    parts = [{"text": "IMG_4711"}, {"text": "a red circle", "weight": 0.5}]
    for mode in ("hybrid", "lexical"):
        several = search(client, k=3, query=parts, mode=mode)
        assert several["results"][0]["id"] == key(11), mode
    for weight in ("1", True, None):  # a weight is a JSON number, nothing converted
        assert "weight" in error(client, 422, query=[{"text": "x", "weight": weight}])
    assert search(client, k=1, query=[{"text": "x", "weight": 2}])["results"]  # an int is a number


def test_browse_opens_newest_first(client: httpx.Client) -> None:
    first = search(client, k=10, mode="browse")
    rest = search(client, k=100, mode="browse", cursor=first["next"])
    order = [r["id"] for r in first["results"] + rest["results"]]
    dated = sorted((i for i in range(N) if i % 3), reverse=True)
    undated = sorted((i for i in range(N) if not i % 3), reverse=True)  # newest added first
    assert order == [key(i) for i in dated + undated]
    assert "takes no query" in error(client, 422, mode="browse", text="x")
    oldest = search(client, k=100, mode="browse", sort="taken")  # dated oldest first, then the rest
    assert [r["id"] for r in oldest["results"]] == [key(i) for i in dated[::-1] + undated]


def test_cli_arithmetic_and_hybrid(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(10):
        (folder / f"IMG_{4700 + i}.png").write_bytes(png(i))
    index = str(tmp_path / "i.db")
    model = str(demo_model_path())

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EXE, *args, "--index", index, "--model", model],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    assert run("index", str(folder)).returncode == 0
    out = run(
        "search",
        "a red circle",
        "--add",
        str(folder / "IMG_4703.png"),
        "--subtract",
        "a blue square",
        "-k",
        "5",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    plugin = OnnxClipPlugin()
    plugin.initialize(PluginConfig(model=ModelConfig(path=model)))
    try:
        images = np.array(
            [
                plugin.generate_embedding(str(folder / f"IMG_{4700 + i}.png")).embedding
                for i in range(10)
            ]
        )
        red = plugin.generate_text_embedding("a red circle").embedding
        blue = plugin.generate_text_embedding("a blue square").embedding
    finally:
        plugin.shutdown()
    q = unit(unit(red) + unit(images[3]) - unit(blue))
    expected = [f"IMG_{4700 + int(i)}.png" for i in np.argsort(-(unit_rows(images) @ q))[:5]]
    assert [Path(h["path"]).name for h in json.loads(out.stdout)] == expected
    # TEXT --image F: both are parts of one query (the issue's `search TEXT [--image F]`).
    both = run("search", "a red circle", "--image", str(folder / "IMG_4703.png"), "--json")
    assert both.returncode == 0, both.stderr
    q = unit(unit(red) + unit(images[3]))
    expected = [f"IMG_{4700 + int(i)}.png" for i in np.argsort(-(unit_rows(images) @ q))[:10]]
    assert [Path(h["path"]).name for h in json.loads(both.stdout)] == expected
    hybrid = run("search", "IMG_4706", "--hybrid", "-k", "3", "--json")
    assert hybrid.returncode == 0, hybrid.stderr
    assert Path(json.loads(hybrid.stdout)[0]["path"]).name == "IMG_4706.png"
    bad = run("search", "--image", str(folder / "IMG_4701.png"), "--hybrid")
    assert bad.returncode == 2 and "--hybrid needs a text" in bad.stderr
