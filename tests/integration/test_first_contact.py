"""What a new user meets first (issue 26): /v1/embeddings inputs, truncation, model names and
language codes, against a real ``themis-clip serve`` of the shipped demo model."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import ServerProcess, photo_like
from themis_clip import OnnxClipPlugin, PluginConfig
from themis_clip.resources import demo_model_path

# Each test starts real processes (a `themis-clip serve`, a Hub stand-in): the slower set.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(["--no-warmup"]) as s:  # no --model: the demo model
        yield s


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def plugin() -> Iterator[OnnxClipPlugin]:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(demo_model_path())}}))
    yield p
    p.shutdown()


def _png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo_like(64, 48, 3)).save(buf, "PNG")
    return buf.getvalue()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _error(r: httpx.Response, status: int) -> dict[str, str]:
    assert r.status_code == status, r.text
    body: dict[str, str] = r.json()["error"]
    return body


def test_an_image_data_url_is_an_image_without_modality(
    http: httpx.Client, plugin: OnnxClipPlugin
) -> None:
    png = _png()
    image = plugin.generate_embedding(png).embedding
    text = plugin.generate_text_embedding("a red circle").embedding
    r = http.post("/v1/embeddings", json={"input": _url(png)})
    assert r.status_code == 200, r.text
    assert np.allclose(r.json()["data"][0]["embedding"], image, atol=1e-6)
    mixed = http.post("/v1/embeddings", json={"input": ["a red circle", _url(png)]}).json()
    got = [row["embedding"] for row in mixed["data"]]
    assert [row["index"] for row in mixed["data"]] == [0, 1]
    assert np.allclose(got[0], text, atol=1e-6) and np.allclose(got[1], image, atol=1e-6)
    err = _error(http.post("/v1/embeddings", json={"input": [_url(png)], "modality": "text"}), 422)
    assert "input[0] is an image data URL but modality is 'text'" in err["message"]
    body = {"input": [_url(png), "a red circle"], "modality": "image"}
    err = _error(http.post("/v1/embeddings", json=body), 422)
    assert "input[1] is text but modality is 'image'" in err["message"]


def test_long_texts_are_cut_visibly_or_refused(http: httpx.Client) -> None:
    long = "a red circle on a blue square " * 40
    r = http.post("/v1/embeddings", json={"input": ["short", long]})
    assert r.status_code == 200, r.text
    assert [row["truncated"] for row in r.json()["data"]] == [False, True]
    assert r.headers["x-truncated-inputs"] == "1"
    assert http.post("/v1/embeddings", json={"input": "short"}).headers["x-truncated-inputs"] == "0"
    err = _error(http.post("/v1/embeddings", json={"input": ["ok", long], "truncate": False}), 422)
    assert (
        err["type"] == "TextTooLong"
        and "input[1] is longer than the model's context" in (err["message"])
    )
    ok = http.post("/v1/embeddings", json={"input": "short", "truncate": False})
    assert ok.status_code == 200


def test_an_unknown_model_is_a_404_in_openais_shape(
    http: httpx.Client, plugin: OnnxClipPlugin
) -> None:
    identity = plugin.model_identity
    assert identity is not None
    for name in ("text-embedding-ada-002", "text-embedding-3-small"):
        err = _error(http.post("/v1/embeddings", json={"input": "a", "model": name}), 404)
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert name in err["message"] and identity.model_id in err["message"]
        assert _error(http.get(f"/v1/models/{name}"), 404)["code"] == "model_not_found"
    for name in (identity.model_id, identity.name):
        r = http.post("/v1/embeddings", json={"input": "a", "model": name})
        assert r.status_code == 200, r.text
        card = http.get(f"/v1/models/{name}").json()
        assert card["id"] == identity.model_id
        stats = plugin.get_statistics()
        assert (card["backend"], card["precision"]) == (stats["backend"], stats["precision"])
        assert card["precision"] in ("f32", "bf16", "f16")
        assert card["precision_variant"] == stats["precision_variant"] == "fp32"


def test_language_codes(http: httpx.Client) -> None:
    for path, body in (
        ("/v1/embeddings", {"input": "a red circle"}),
        ("/embed/text", {"text": "a red circle"}),
    ):
        err = _error(http.post(path, json={**body, "language": "english"}), 422)
        assert "'english' is not a Flores-200 code" in err["message"]
        ignored = http.post(path, json={**body, "language": "deu_Latn"})
        assert ignored.status_code == 200 and ignored.json()["language_ignored"] is True
        assert "language_ignored" not in http.post(path, json=body).json()


def test_classify_answers_the_raw_cosine_beside_the_probability(
    http: httpx.Client, plugin: OnnxClipPlugin
) -> None:
    from themis_clip.demo.scenes import Scene, render_scene

    buf = io.BytesIO()
    render_scene(Scene(shape="circle", colour="red")).save(buf, "PNG")
    r = http.post("/v1/classify", json={"image": _url(buf.getvalue()), "labels": ["car", "dog"]})
    assert r.status_code == 200, r.text
    labels = r.json()["labels"]
    image = plugin.generate_embedding(buf.getvalue()).embedding
    for row in labels:
        text = plugin.generate_text_embedding(f"a photo of a {row['label']}").embedding
        assert row["cosine"] == pytest.approx(float(np.dot(image, text)), abs=1e-4)
    assert sum(row["probability"] for row in labels) == pytest.approx(1.0, abs=1e-5)
