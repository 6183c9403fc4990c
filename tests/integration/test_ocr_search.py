"""Finding photos by the text in them, end to end with the real PP-OCRv4 models: a folder of
generated scenes (a STARBUCKS sign, the same sign turned a quarter and upside down, a museum
sign, text-free landscapes) indexed with OCR on both stores, searched by substring in lexical and hybrid mode
through the library, the CLI and a real server; OCR added to an index built without it reads
text only."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.cdp import Browser, chromium
from tests.helpers import ServerProcess
from tests.ocr_gallery import fonts, make_scene
from themis_clip import PluginConfig, demo_model_path
from themis_clip.cli import main
from themis_clip.collection import Collection, lexical
from themis_clip.config import ModelConfig, OCRConfig
from themis_clip.index.where import parse_where
from themis_clip.interface import BackendType
from themis_clip.models.ocr import OCR_WHEEL

try:
    metadata.distribution(OCR_WHEEL)
except metadata.PackageNotFoundError:
    pytest.skip(f"{OCR_WHEEL} (the OCR models) is not installed", allow_module_level=True)
FONTS = fonts()
if not FONTS:
    pytest.skip("no gallery font (apt install fonts-dejavu-core)", allow_module_level=True)

pytestmark = pytest.mark.slow  # each test runs the OCR models
EXE = str(Path(sys.executable).parent / "themis-clip")


@pytest.fixture(scope="module")
def gallery(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gallery")
    make_scene(folder / "cafe.jpg", kind="sign", font=FONTS[0], seed=3, word="STARBUCKS")
    make_scene(
        folder / "turned.jpg", kind="sign", font=FONTS[1], seed=5, word="STARBUCKS", rotation=90
    )
    make_scene(
        folder / "flipped.jpg", kind="sign", font=FONTS[1], seed=5, word="STARBUCKS", rotation=180
    )
    make_scene(folder / "m.jpg", kind="sign", font=FONTS[-1], seed=7, word="MUSEUM")
    make_scene(folder / "hills.jpg", kind="landscape", font=FONTS[0], seed=11)
    make_scene(folder / "lake.jpg", kind="landscape", font=FONTS[0], seed=12)
    return folder


def config(ocr: bool = False) -> PluginConfig:
    return PluginConfig(
        model=ModelConfig(path=str(demo_model_path())),
        backend=BackendType.CPU,
        ocr=OCRConfig(enabled=ocr),
    )


def names(hits: object) -> list[str]:
    return [Path(h.key).name for h in hits]  # type: ignore[attr-defined]


def test_index_with_ocr_then_search_by_substring(
    location: str, gallery: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "photos"
    shutil.copytree(gallery, folder)
    gallery = folder
    with Collection.open(location, config()) as photos:
        plain = photos.index_folder(gallery)  # no OCR: nothing read, nothing found
        assert plain.added == 6 and plain.read == 0
        assert list(lexical(photos.index, "bucks")) == []
        before = {
            k: photos.index.store.vector(k) for k in photos.index.store.items_under(str(gallery))
        }
        # OCR added to the existing index: text read, nothing embedded again.
        report = photos.index_folder(gallery, ocr=True)
        assert report.embedded == 0 and report.unchanged == 6
        assert report.read == 6 and report.with_text == 4 and report.unread == []
        for key, vector in before.items():
            assert np.array_equal(photos.index.store.vector(key), vector)
        again = photos.index_folder(gallery, ocr=True)
        assert again.read == 0  # every item has its reading

        found = lexical(photos.index, "bucks", k=5)
        turned = ["cafe.jpg", "flipped.jpg", "turned.jpg"]
        assert sorted(names(found)) == turned  # turned text is found too
        for hit in found:
            (match,) = hit.text_matches
            assert match["text"].upper() == "STARBUCKS" and len(match["box"]) == 4
            xs = [x for x, _ in match["box"]]
            ys = [y for _, y in match["box"]]
            tall = max(ys) - min(ys) > max(xs) - min(xs)
            assert tall == (Path(hit.key).name == "turned.jpg")  # the box is where it stands
        (upside_down,) = (h for h in found if h.key.endswith("flipped.jpg"))
        (tl, _, br, _) = upside_down.text_matches[0]["box"]
        assert tl[0] > br[0] and tl[1] > br[1]  # read from its top-left: the picture's bottom-right
        assert names(lexical(photos.index, "museum")) == ["m.jpg"]
        assert names(lexical(photos.index, "starbuks")) != []  # a misspelling, tolerated
        hybrid = photos.search("bucks", k=6, hybrid=True)
        assert sorted(names(hybrid.hits[:3])) == turned
        assert all(h.text_matches for h in hybrid.hits[:3])
        with_text = photos.browse(k=10, where=parse_where({"$has_text": True}))
        assert sorted(names(with_text)) == ["cafe.jpg", "flipped.jpg", "m.jpg", "turned.jpg"]
        none = photos.browse(k=10, where=parse_where({"$has_text": False}))
        assert sorted(names(none)) == ["hills.jpg", "lake.jpg"]
        # A changed file loses its old reading and is read again.
        make_scene(gallery / "m.jpg", kind="sign", font=FONTS[0], seed=8, word="HARBOUR")
        changed = photos.index_folder(gallery, ocr=True)
        assert changed.updated == 1 and changed.read == 1
        assert names(lexical(photos.index, "harbour")) == ["m.jpg"]
        assert names(lexical(photos.index, "museum")) == []


def test_cli_index_ocr_and_lexical_search(
    tmp_path: Path, gallery: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = str(tmp_path / "i.db")
    model = ["--model", str(demo_model_path()), "--backend", "cpu"]
    assert main(["index", str(gallery), "--index", index, "--ocr", *model]) == 0
    out = capsys.readouterr().out
    assert "text read in 6 picture(s), found in 4" in out
    assert main(["search", "BUCKS", "--mode", "lexical", "--index", index, "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert sorted(Path(h["key"]).name for h in hits) == ["cafe.jpg", "flipped.jpg", "turned.jpg"]
    assert all(h["text_matches"][0]["text"] == "STARBUCKS" for h in hits)
    where = ["--where", '{"$has_text": true}']
    assert main(["search", "museum", "--mode", "lexical", "--index", index, *where]) == 0
    assert "m.jpg" in capsys.readouterr().out
    code = main(["search", "bucks", "--mode", "lexical", "--image", "x.jpg", "--index", index])
    assert code != 0 and "--mode lexical" in capsys.readouterr().err


@pytest.fixture
def ocr_server(tmp_path: Path) -> Iterator[httpx.Client]:
    settings = tmp_path / "config.json"
    settings.write_text(
        json.dumps({"model": {"path": str(demo_model_path())}, "ocr": {"enabled": True}})
    )
    args = ["--config", str(settings), "--index", str(tmp_path / "i.db"), "--backend", "cpu"]
    with ServerProcess(args) as server, httpx.Client(base_url=server.base, timeout=120) as c:
        yield c


def test_items_added_over_http_are_read_and_found(ocr_server: httpx.Client, gallery: Path) -> None:
    import base64

    def item(name: str) -> dict[str, str]:
        data = base64.b64encode((gallery / name).read_bytes()).decode()
        return {"id": name, "image": "data:image/jpeg;base64," + data}

    added = ocr_server.post("/index/items", json={"items": [item("cafe.jpg"), item("lake.jpg")]})
    assert added.status_code == 200, added.text
    found = ocr_server.post(
        "/search", json={"text": "bucks", "mode": "lexical", "k": 5, "cut": "none"}
    )
    assert found.status_code == 200, found.text
    (hit,) = found.json()["results"]
    assert hit["id"] == "cafe.jpg"
    (match,) = hit["text_matches"]
    assert match["text"] == "STARBUCKS" and len(match["box"]) == 4 and match["confidence"] > 0.5
    texts = ocr_server.post(
        "/search", json={"mode": "browse", "k": 5, "where": {"$has_text": True}}
    ).json()
    assert [r["id"] for r in texts["results"]] == ["cafe.jpg"]
    schema = ocr_server.get("/openapi.json").json()["components"]["schemas"]
    assert "text_matches" in schema["Item"]["properties"] and "TextMatch" in schema


@pytest.mark.skipif(
    chromium() is None and not os.environ.get("CI"), reason="chromium not installed (CI has it)"
)
def test_the_viewer_outlines_the_matched_text(ocr_server: httpx.Client, gallery: Path) -> None:
    """In headless Chromium: a hybrid search for "bucks", the first result opened, and the
    outline drawn where the sign's word is on the picture as shown."""
    import base64

    items = [
        {"id": n, "image": "data:image/jpeg;base64," + base64.b64encode(p.read_bytes()).decode()}
        for n, p in (("cafe", gallery / "cafe.jpg"), ("hills", gallery / "hills.jpg"))
    ]
    assert ocr_server.post("/index/items", json={"items": items}).status_code == 200
    expected = ocr_server.post(
        "/search", json={"text": "bucks", "mode": "hybrid", "k": 2, "cut": "none"}
    ).json()["results"]
    cafe = next(r for r in expected if r["id"] == "cafe")
    (match,) = cafe["text_matches"]
    browser = Browser()
    try:
        browser.navigate(str(ocr_server.base_url) + "/")
        browser.wait_for("document.getElementById('info').textContent.includes('items')")
        browser.evaluate("document.getElementById('hybrid').checked = true")
        browser.type_text("#q", "bucks")
        browser.press_enter()
        browser.wait_for("document.getElementById('status').textContent.includes('together')")
        browser.evaluate(
            "[...document.querySelectorAll('#results figure')]"
            ".find(f => f.querySelector('.name').textContent === 'cafe')"
            ".querySelector('button.card').click()"
        )
        browser.wait_for(
            "(() => { const i = document.getElementById('v-img');"
            " return i.complete && i.naturalWidth > 0; })()"
        )
        got = browser.evaluate(
            "(() => { const i = document.getElementById('v-img').getBoundingClientRect();"
            " const s = [...document.querySelectorAll('#v-marks polygon')];"
            " return {img: [i.left, i.top, i.width, i.height], n: s.length,"
            " box: s.map(p => { const r = p.getBoundingClientRect();"
            " return [r.left, r.top, r.right, r.bottom]; }),"
            " title: s.map(p => p.textContent),"
            " shown: document.getElementById('v-title').textContent}; })()"
        )
        assert got["shown"] == "cafe" and got["n"] == 1 and got["title"] == ["STARBUCKS"]
        left, top, width, height = got["img"]
        fw, fh = match["frame"]
        xs = [left + x * width / fw for x, _ in match["box"]]
        ys = [top + y * height / fh for _, y in match["box"]]
        want = [min(xs), min(ys), max(xs), max(ys)]
        assert all(abs(a - b) <= 3 for a, b in zip(got["box"][0], want, strict=True)), (got, want)
        assert width < fw  # shown smaller than the picture: the outline was scaled
        # Another result without matched text: no outline.
        browser.evaluate(
            "(() => { const n = document.getElementById('v-next');"
            " (n.disabled ? document.getElementById('v-prev') : n).click(); })()"
        )
        browser.wait_for("document.querySelectorAll('#v-marks polygon').length === 0")
    finally:
        browser.close()


def _items(gallery: Path, prefix: str, n: int) -> list[dict[str, str]]:
    import base64

    data = (
        "data:image/jpeg;base64," + base64.b64encode((gallery / "cafe.jpg").read_bytes()).decode()
    )
    return [{"id": f"{prefix}{i}", "image": data} for i in range(n)]


def test_items_are_stored_first_and_read_within_the_deadline(tmp_path: Path, gallery: Path) -> None:
    """More pictures than the deadline lets OCR read: every item is stored, those read are
    found by their text, the answer counts the rest; a client that leaves stops the reading."""
    settings = tmp_path / "config.json"
    settings.write_text(
        json.dumps({"model": {"path": str(demo_model_path())}, "ocr": {"enabled": True}})
    )
    args = ["--config", str(settings), "--index", str(tmp_path / "i.db"), "--backend", "cpu"]
    with (
        ServerProcess([*args, "--request-timeout-s", "6"]) as server,
        httpx.Client(base_url=server.base, timeout=120) as client,
    ):
        added = client.post("/index/items", json={"items": _items(gallery, "a", 40)})
        assert added.status_code == 200, added.text
        body = added.json()
        assert body["added"] == 40 and 0 < body["text_unread"] < 40, body
        everything = client.post("/search", json={"mode": "browse", "k": 100}).json()
        assert len(everything["results"]) == 40
        read = client.post(
            "/search", json={"text": "bucks", "mode": "lexical", "k": 100, "cut": "none"}
        ).json()["results"]
        assert len(read) == 40 - body["text_unread"]
        # A client that gives up: the server stops reading before the next picture.
        with pytest.raises(httpx.TimeoutException):
            client.post("/index/items", json={"items": _items(gallery, "b", 40)}, timeout=2.5)
        deadline = time.monotonic() + 20
        while not any("(request gone)" in line for line in server.log):
            assert time.monotonic() < deadline, "".join(server.log[-20:])
            time.sleep(0.1)


def test_a_bad_ocr_model_is_one_line_before_serving_or_indexing(
    tmp_path: Path, gallery: Path
) -> None:
    import subprocess

    settings = tmp_path / "config.json"
    model = str(demo_model_path())
    for missing in (tmp_path / "nowhere", tmp_path):  # no folder; a folder without a detector
        settings.write_text(
            json.dumps({"model": {"path": model}, "ocr": {"enabled": True, "models": str(missing)}})
        )
        for command in (
            ["serve", "--port", "0", "--index", str(tmp_path / "s.db"), "--new-index"],
            ["index", str(gallery), "--index", str(tmp_path / "i.db")],
        ):
            done = subprocess.run(
                [EXE, *command, "--config", str(settings), "--backend", "cpu"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 2, done.stderr
            (line,) = done.stderr.strip().splitlines()
            assert "OCR model" in line and str(missing) in line and "listening" not in line, line
        assert not (tmp_path / "i.db").exists()  # the index a failed run created is removed
