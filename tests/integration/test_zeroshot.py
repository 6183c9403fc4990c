"""Zero-shot classification against PyTorch's own ``logits_per_image`` (slow: torch)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.helpers import encode, photo_like  # noqa: E402
from themis_clip import OnnxClipPlugin, PluginConfig  # noqa: E402
from themis_clip.errors import InputError  # noqa: E402
from themis_clip.export.hf import create_random_checkpoint, export_hf_checkpoint, load_reference  # noqa: E402
from themis_clip.export.tokenizer import build_clip_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow

LABELS = ["cat", "a dog", "a red car parked on the left of a very long street", "tree", "sky"]
TEMPLATE = "a photo of a {}"
IMAGES = [photo_like(40 + 9 * i, 30 + 13 * i, i) for i in range(3)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("zs")
    build_clip_tokenizer(root / "tokenizer.json")
    checkpoint = create_random_checkpoint(
        root / "tiny-clip", root / "tokenizer.json", image_size=48, patch=8, seed=5
    )
    out = root / "model"
    export_hf_checkpoint(checkpoint, out, precisions=["fp32"])
    return checkpoint, out


@pytest.fixture(scope="module")
def plugin(model: tuple[Path, Path]) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(model[1])}})), p.last_error
    return p


def test_probabilities_equal_pytorch_logits_per_image_softmax(
    model: tuple[Path, Path], plugin: OnnxClipPlugin
) -> None:
    checkpoint, out = model
    manifest = json.loads((out / "manifest.json").read_text())
    reference = load_reference(checkpoint)
    scale = float(reference.logit_scale.exp())
    assert manifest["scoring"]["logit_scale"] == pytest.approx(scale)
    assert abs(scale - 100.0) > 1  # a random checkpoint's own scale, not OpenAI's default
    assert plugin.get_statistics()["text_tower"]
    pixels = torch.from_numpy(np.stack([plugin.preprocess(i) for i in IMAGES]))
    rows = plugin.tokenize([TEMPLATE.format(x) for x in LABELS])
    width = max(len(r) for r in rows)
    ids = torch.tensor([list(r) + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        expected = (
            reference(input_ids=ids, attention_mask=mask, pixel_values=pixels)
            .logits_per_image.softmax(dim=-1)
            .numpy()
        )
    for i, image in enumerate(IMAGES):
        got = np.array([s.probability for s in plugin.classify(image, LABELS, template=TEMPLATE)])
        assert np.abs(got - expected[i]).max() < 1e-5, (got, expected[i])
        assert abs(got.sum() - 1) < 1e-9
    # A stored vector gives the same answer (the HTTP "item" path), from cached label vectors.
    vector = plugin.generate_embedding(IMAGES[0]).embedding
    again = plugin.classify_embedding(vector, LABELS, template=TEMPLATE)  # type: ignore[arg-type]
    assert np.abs(np.array([s.probability for s in again]) - expected[0]).max() < 1e-5


def test_sigmoid_with_bias_when_the_model_records_one() -> None:
    from themis_clip.zeroshot import score_labels

    image = np.array([1.0, 0.0], dtype=np.float32)
    labels = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    scores = score_labels(image, labels, ["a", "b"], logit_scale=10.0, logit_bias=-5.0)
    expected = 1 / (1 + np.exp(-np.array([10.0 - 5.0, 0.0 - 5.0])))
    assert np.allclose([s.probability for s in scores], expected, atol=1e-12)


def test_bad_labels_and_templates_are_clear_errors(plugin: OnnxClipPlugin) -> None:
    image = IMAGES[0]
    for labels, template, says in (
        ([], TEMPLATE, "at least one label"),
        (["a", ""], TEMPLATE, r"labels\[1\]: must be a non-empty string"),
        ("cat", TEMPLATE, "a list of labels"),
        (["a"], "no placeholder", "exactly once"),
        (["a"], "{} and {}", "exactly once"),
    ):
        with pytest.raises(InputError, match=says):
            plugin.classify(image, labels, template=template)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="at most 3"):
        plugin.classify(image, ["a", "b", "c", "d"], max_labels=3)
    with pytest.raises(InputError, match="not a recognised image"):
        plugin.classify(b"not an image", ["a"])


def test_cli_and_http(
    model: tuple[Path, Path],
    plugin: OnnxClipPlugin,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fastapi.testclient import TestClient

    from themis_clip.cli import main
    from themis_clip.server import ServerSettings, create_app

    _, out = model
    png = encode(__import__("PIL.Image", fromlist=["Image"]).fromarray(IMAGES[1]), "PNG")
    (tmp_path / "x.png").write_bytes(png)
    expected = {s.label: s.probability for s in plugin.classify(png, LABELS)}
    code = main(
        [
            "classify",
            str(tmp_path / "x.png"),
            "--labels",
            ",".join(LABELS),
            "--json",
            "--model",
            str(out),
        ]
    )
    assert code == 0
    row = json.loads(capsys.readouterr().out.strip())
    assert {r["label"]: r["probability"] for r in row["labels"]} == pytest.approx(
        expected, abs=1e-6
    )
    assert main(["classify", str(tmp_path / "x.png"), "--labels", " , ", "--model", str(out)]) == 2
    app = create_app(
        ServerSettings(
            plugin_config=PluginConfig.from_dict({"model": {"path": str(out)}}),
            index_path=str(tmp_path / "i.db"),
            warmup=False,
        )
    )
    with TestClient(app) as c:
        data = base64.b64encode(png).decode()
        r = c.post("/v1/classify", json={"image": data, "labels": LABELS})
        assert r.status_code == 200, r.text
        got = {x["label"]: x["probability"] for x in r.json()["labels"]}
        assert got == pytest.approx(expected, abs=1e-6) and r.json()["scoring"] == "softmax"
        probs = [x["probability"] for x in r.json()["labels"]]
        assert probs == sorted(probs, reverse=True)
        assert (
            c.post("/index/items", json={"items": [{"id": "x", "image": data}]}).status_code == 200
        )
        by_item = c.post("/v1/classify", json={"item": "x", "labels": LABELS}).json()
        assert {x["label"]: x["probability"] for x in by_item["labels"]} == pytest.approx(
            expected, abs=1e-6
        )
        for body, status in (
            ({"item": "nope", "labels": ["a"]}, 404),
            ({"image": data, "labels": []}, 422),
            ({"image": data, "item": "x", "labels": ["a"]}, 422),
            ({"image": data, "labels": ["a"], "template": "no slot"}, 422),
            ({"image": data, "labels": ["a"] * 1025}, 422),
        ):
            assert c.post("/v1/classify", json=body).status_code == status, body


def test_rank_both_ways_equals_pytorch_and_http(
    model: tuple[Path, Path], plugin: OnnxClipPlugin, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient
    from PIL import Image

    from themis_clip.server import ServerSettings, create_app

    checkpoint, out = model
    reference = load_reference(checkpoint)
    assert plugin.get_statistics()["text_tower"]
    pixels = torch.from_numpy(np.stack([plugin.preprocess(i) for i in IMAGES]))
    texts = [TEMPLATE.format(x) for x in LABELS]
    rows = plugin.tokenize(texts)
    width = max(len(r) for r in rows)
    ids = torch.tensor([list(r) + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        out_t = reference(input_ids=ids, attention_mask=mask, pixel_values=pixels)
    per_text = out_t.logits_per_text.softmax(-1).numpy()  # a text ranks the images
    per_image = out_t.logits_per_image.softmax(-1).numpy()  # an image ranks the texts
    ranked = plugin.rank(texts[1], IMAGES)
    assert [r.index for r in ranked] == list(np.argsort(-per_text[1], kind="stable"))
    assert (
        np.abs(
            np.array([r.probability for r in sorted(ranked, key=lambda r: r.index)]) - per_text[1]
        ).max()
        < 1e-5
    )
    ranked = plugin.rank(IMAGES[2], texts)
    assert (
        np.abs(
            np.array([r.probability for r in sorted(ranked, key=lambda r: r.index)]) - per_image[2]
        ).max()
        < 1e-5
    )
    cos = [r.cosine for r in ranked]
    assert cos == sorted(cos, reverse=True)
    with pytest.raises(InputError, match="give str candidates"):
        plugin.rank(IMAGES[0], [IMAGES[1]])  # type: ignore[list-item]
    with pytest.raises(InputError, match="at least one"):
        plugin.rank("x", [])
    app = create_app(
        ServerSettings(
            plugin_config=PluginConfig.from_dict({"model": {"path": str(out)}}), warmup=False
        )
    )
    pngs = [base64.b64encode(encode(Image.fromarray(i), "PNG")).decode() for i in IMAGES]
    with TestClient(app) as c:
        r = c.post("/rank", json={"text": texts[1], "images": pngs})
        assert r.status_code == 200, r.text
        got = {x["index"]: x["probability"] for x in r.json()["ranking"]}
        assert (
            np.abs(np.array([got[i] for i in range(3)]) - per_text[1]).max() < 1e-4
        )  # PNG: lossless
        r = c.post("/rank", json={"image": pngs[2], "texts": texts})
        assert r.status_code == 200 and r.json()["ranking"][0]["index"] == int(
            np.argmax(per_image[2])
        )
        for body in (
            {"text": "a", "texts": ["b"]},
            {"image": pngs[0], "images": pngs},
            {"text": "a"},
        ):
            assert c.post("/rank", json=body).status_code == 422, body


def test_the_label_cap_is_a_server_setting(model: tuple[Path, Path]) -> None:
    from fastapi.testclient import TestClient

    from themis_clip.server import ServerSettings, create_app

    _, out = model
    app = create_app(
        ServerSettings(
            plugin_config=PluginConfig.from_dict({"model": {"path": str(out)}}),
            max_labels=2,
            warmup=False,
        )
    )
    data = base64.b64encode(
        encode(__import__("PIL.Image", fromlist=["Image"]).fromarray(IMAGES[0]), "PNG")
    ).decode()
    with TestClient(app) as c:
        assert c.post("/v1/classify", json={"image": data, "labels": ["a", "b"]}).status_code == 200
        r = c.post("/v1/classify", json={"image": data, "labels": ["a", "b", "c"]})
        assert r.status_code == 422 and "at most 2" in r.json()["error"]["message"]
        r = c.post("/rank", json={"image": data, "texts": ["a", "b", "c"]})
        assert r.status_code == 422 and "at most 2" in r.json()["error"]["message"]
