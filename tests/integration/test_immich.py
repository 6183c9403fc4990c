"""immich's machine-learning contract against the real server: ``/ping`` and ``/predict`` as
immich's server calls them, vectors equal to ``/v1/embeddings`` and to immich's own
preprocessing (restated below) on the same ONNX files, and the keyless network allow-list.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest
from PIL import Image
from tokenizers import Tokenizer, processors

from tests.helpers import ServerProcess, encode, new_key, photo_like
from tests.hubtools import immich_repo
from tests.hubtools import serve as hub_serve
from themis_clip.server.routes.dialects import ImmichPrediction
from themis_clip.vocabulary import CLIP_MEAN, CLIP_STD

pytestmark = pytest.mark.slow  # real server processes

MODEL = "ViT-B-32__openai"  # the name immich's settings hold, and the folder's


@pytest.fixture(scope="module")
def immich_model(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """An immich model folder (as immich's cache holds it) with open_clip's usual
    preprocessing: shortest-side bicubic resize, centre crop, CLIP's mean and std."""
    root = immich_repo(tmp_path_factory.mktemp("immich") / MODEL, tiny_model_dir / "tokenizer.json")
    (root / "visual" / "preprocess_cfg.json").write_text(
        json.dumps(
            {
                "size": [48, 48],
                "mode": "RGB",
                "mean": list(CLIP_MEAN),
                "std": list(CLIP_STD),
                "interpolation": "bicubic",
                "resize_mode": "shortest",
            }
        )
    )
    # immich's tokenizer.json (open_clip's HF tokenizer) adds the start and end tokens itself.
    tok_file = root / "textual" / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_file))
    sot, eot = "<|startoftext|>", "<|endoftext|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{sot} $A {eot}",
        special_tokens=[(sot, tok.token_to_id(sot)), (eot, tok.token_to_id(eot))],
    )
    tok.save(str(tok_file))
    (root / "textual" / "tokenizer_config.json").write_text(
        json.dumps({"pad_token": "<|endoftext|>", "model_max_length": 77})
    )
    return root


@pytest.fixture(scope="module")
def server(immich_model: Path) -> Iterator[ServerProcess]:
    with ServerProcess(["--model", str(immich_model), "--no-warmup"]) as s:
        yield s


# What immich's server sends (server/src/repositories/machine-learning.repository.ts):
# FormData with 'entries' = JSON.stringify(config), then 'image' = new Blob([file]) (a file part
# named "blob", application/octet-stream) or 'text'.
def visual_entries(model: str = MODEL) -> str:
    return json.dumps({"clip": {"visual": {"modelName": model}}})


def textual_entries(language: str | None = None, model: str = MODEL) -> str:
    options = {"language": language} if language is not None else {}
    return json.dumps({"clip": {"textual": {"modelName": model, "options": options}}})


def predict_image(base: str, data: bytes, entries: str | None = None, **kw: Any) -> httpx.Response:
    return httpx.post(
        f"{base}/predict",
        data={"entries": entries or visual_entries()},
        files={"image": ("blob", data, "application/octet-stream")},
        timeout=30,
        **kw,
    )


def predict_text(base: str, text: str, entries: str | None = None, **kw: Any) -> httpx.Response:
    # Node's FormData is multipart even with string fields only.
    fields = {"entries": (None, entries or textual_entries()), "text": (None, text)}
    return httpx.post(f"{base}/predict", files=fields, timeout=30, **kw)


def clip_vector(r: httpx.Response) -> npt.NDArray[np.float32]:
    """What immich's server does with the answer: ``response.clip``, a string it stores as is
    (pgvector parses it)."""
    assert r.status_code == 200, r.text
    clip = r.json()["clip"]
    assert isinstance(clip, str)
    return np.asarray(json.loads(clip), dtype=np.float32)


def openai_vector(base: str, value: str) -> npt.NDArray[np.float32]:
    r = httpx.post(f"{base}/v1/embeddings", json={"input": [value]}, timeout=30)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)


def images() -> list[bytes]:
    wide = Image.fromarray(photo_like(90, 50, 1))
    tall = Image.fromarray(photo_like(41, 77, 2))
    rgba = Image.fromarray(photo_like(64, 64, 3)).convert("RGBA")
    gray = Image.fromarray(photo_like(70, 52, 4)).convert("L")
    return [
        encode(wide, "JPEG", quality=92),
        encode(tall, "PNG"),
        encode(rgba, "PNG"),
        encode(gray, "PNG"),
    ]


TEXTS = ["a red circle", "  two   dogs\ton a beach ", "x"]


def test_ping_answers_pong_without_a_key(server: ServerProcess) -> None:
    r = httpx.get(f"{server.base}/ping")
    assert r.status_code == 200 and r.text == "pong"
    assert r.headers["content-type"].startswith("text/plain")


def test_vectors_are_bit_equal_to_v1_embeddings(server: ServerProcess) -> None:
    for data in images():
        r = predict_image(server.base, data)
        body = r.json()
        ImmichPrediction.model_validate(body)  # what /docs shows, no undocumented key
        width, height = Image.open(__import__("io").BytesIO(data)).size
        assert (body["imageWidth"], body["imageHeight"]) == (width, height)
        got = clip_vector(r)
        want = openai_vector(
            server.base, "data:image/png;base64," + base64.b64encode(data).decode()
        )
        assert got.tobytes() == want.tobytes()
    for text in TEXTS:
        # immich sends its interface language; a model without language prefixes ignores it
        for entries in (textual_entries(), textual_entries("de"), textual_entries("zh-TW")):
            r = predict_text(server.base, text, entries)
            assert set(r.json()) == {"clip"}
            ImmichPrediction.model_validate(r.json())
            assert clip_vector(r).tobytes() == openai_vector(server.base, text).tobytes()


# immich's preprocessing, restated from immich machine-learning (models/transforms.py,
# models/clip/visual.py OpenClipVisualEncoder, models/clip/textual.py OpenClipTextualEncoder).
def immich_visual(model: Path, data: bytes) -> npt.NDArray[np.float32]:
    import io

    cfg = json.loads((model / "visual" / "preprocess_cfg.json").read_text())
    size = cfg["size"][0] if isinstance(cfg["size"], list) else cfg["size"]
    resample = {r.name.lower(): r for r in Image.Resampling}[cfg["interpolation"].lower()]
    image = Image.open(io.BytesIO(data))  # decode_pil
    image.load()
    if image.mode != "RGB":
        image = image.convert("RGB")
    if image.width < image.height:  # resize_pil
        image = image.resize((size, int((image.height / image.width) * size)), resample=resample)
    else:
        image = image.resize((int((image.width / image.height) * size), size), resample=resample)
    left = int((image.size[0] / 2) - (size / 2))  # crop_pil
    upper = int((image.size[1] / 2) - (size / 2))
    image = image.crop((left, upper, left + size, upper + size))
    x = np.asarray(image, dtype=np.float32) / 255.0  # to_numpy
    mean = np.array(cfg["mean"], dtype=np.float32)
    std = np.array(cfg["std"], dtype=np.float32)
    x *= 1.0 / std  # normalize
    x -= mean / std
    session = ort.InferenceSession(str(model / "visual" / "model.onnx"))
    out: npt.NDArray[np.float32] = session.run(None, {"image": x.transpose(2, 0, 1)[None]})[0][0]
    return out


def immich_textual(model: Path, text: str) -> npt.NDArray[np.float32]:
    cfg = json.loads((model / "config.json").read_text())
    context = cfg["text_cfg"].get("context_length", 77)
    pad = json.loads((model / "textual" / "tokenizer_config.json").read_text())["pad_token"]
    tokenizer = Tokenizer.from_file(str(model / "textual" / "tokenizer.json"))
    tokenizer.enable_padding(length=context, pad_token=pad, pad_id=tokenizer.token_to_id(pad))
    tokenizer.enable_truncation(max_length=context)
    ids = tokenizer.encode(" ".join(text.split())).ids  # clean_text
    session = ort.InferenceSession(str(model / "textual" / "model.onnx"))
    out: npt.NDArray[np.float32] = session.run(None, {"text": np.array([ids], dtype=np.int32)})[0][
        0
    ]
    return out


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_vectors_equal_immichs_own_preprocessing(server: ServerProcess, immich_model: Path) -> None:
    for data in images():
        ours = clip_vector(predict_image(server.base, data))
        assert cosine(ours, immich_visual(immich_model, data)) >= 0.99999
    for text in TEXTS:
        ours = clip_vector(predict_text(server.base, text))
        assert cosine(ours, immich_textual(immich_model, text)) >= 0.99999


def test_other_tasks_and_bad_requests_get_clear_errors(server: ServerProcess) -> None:
    data = images()[0]

    def error(r: httpx.Response, status: int, kind: str) -> str:
        assert r.status_code == status, r.text
        assert r.json()["error"]["type"] == kind
        return str(r.json()["error"]["message"])

    # What immich sends for faces and OCR: answered 501, which immich logs with the status.
    faces = {
        "facial-recognition": {
            "detection": {"modelName": "buffalo_l", "options": {"minScore": 0.7}},
            "recognition": {"modelName": "buffalo_l"},
        }
    }
    message = error(predict_image(server.base, data, json.dumps(faces)), 501, "UnsupportedTask")
    assert "facial-recognition" in message and "immich's own machine-learning" in message
    ocr = {
        "ocr": {
            "detection": {"modelName": "PP-OCRv5_mobile", "options": {"minScore": 0.5}},
            "recognition": {"modelName": "PP-OCRv5_mobile", "options": {"minScore": 0.8}},
        }
    }
    error(predict_image(server.base, data, json.dumps(ocr)), 501, "UnsupportedTask")
    # Another model's vectors would be silently incomparable with the ones immich stored.
    message = error(
        predict_image(server.base, data, visual_entries("ViT-L-14__openai")), 404, "ModelNotFound"
    )
    assert "ViT-L-14__openai" in message
    assert (
        predict_image(server.base, data, visual_entries(f"immich-app/{MODEL}")).status_code == 200
    )
    for entries in ("{not json", "[]", '{"clip": {}}', '{"clip": {"visual": {}}}'):
        error(predict_image(server.base, data, entries), 422, "ValidationError")
    error(predict_text(server.base, "hello", visual_entries()), 422, "ValidationError")
    r = httpx.post(f"{server.base}/predict", files={"entries": (None, textual_entries())})
    error(r, 422, "ValidationError")
    error(predict_image(server.base, b"not an image"), 422, "ImageDecodeError")
    # ambiguous forms: which part was meant would be a guess
    both = {"entries": (None, visual_entries()), "text": (None, "a red circle")}
    both["image"] = ("blob", data, "application/octet-stream")
    assert "not both" in error(
        httpx.post(f"{server.base}/predict", files=both), 422, "ValidationError"
    )
    twice = [
        ("entries", (None, visual_entries())),
        ("image", ("blob", data, "application/octet-stream")),
        ("image", ("blob", data, "application/octet-stream")),
    ]
    r = httpx.post(f"{server.base}/predict", files=twice)
    assert "image: given more than once" in error(r, 422, "ValidationError")
    r = httpx.post(f"{server.base}/predict", json={"entries": visual_entries()}, timeout=30)
    error(r, 415, "UnsupportedMediaType")
    # a part over the form's limits is named, whichever it is
    long = "a dog " * (1 << 18)  # 1.5 MiB: over a form field's 1 MiB
    message = error(predict_text(server.base, long), 413, "PayloadTooLarge")
    assert message.startswith("text: a form field over 1048576 bytes"), message
    message = error(
        predict_text(server.base, "a dog", textual_entries() + long), 413, "PayloadTooLarge"
    )
    assert message.startswith("entries: "), message
    latin1 = {"entries": (None, textual_entries()), "text": (None, "caf\xe9".encode("latin-1"))}
    r = httpx.post(f"{server.base}/predict", files=latin1)
    assert error(r, 422, "ValidationError").startswith("text: not valid UTF-8")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    return path, new_key(path, "search", "app"), new_key(path, "metrics", "prometheus")


def test_immich_from_admits_only_predict_from_the_allowed_network(
    immich_model: Path, keys: tuple[Path, str, str]
) -> None:
    path, search_key, metrics_key = keys
    data = images()[0]
    args = ["--model", str(immich_model), "--no-warmup", "--keys", str(path)]
    with ServerProcess([*args, "--immich-from", "127.0.0.0/8"]) as s:
        assert httpx.get(f"{s.base}/ping").text == "pong"
        assert predict_image(s.base, data).status_code == 200  # no key: immich's network
        assert predict_text(s.base, "a dog").status_code == 200
        # every other route still needs a key, from the same network
        r = httpx.post(f"{s.base}/v1/embeddings", json={"input": ["a dog"]})
        assert r.status_code == 401
        assert httpx.get(f"{s.base}/stats").status_code == 401
    with ServerProcess([*args, "--immich-from", "10.0.0.0/8,fd00::/8"]) as s:
        r = predict_image(s.base, data)  # not from immich's network: a key is needed
        assert r.status_code == 401 and "--immich-from" in r.json()["error"]["message"]
        auth = {"Authorization": f"Bearer {search_key}"}
        assert predict_image(s.base, data, headers=auth).status_code == 200
        wrong_scope = {"Authorization": f"Bearer {metrics_key}"}
        assert predict_image(s.base, data, headers=wrong_scope).status_code == 403


def test_immich_from_refuses_what_is_not_a_network(immich_model: Path) -> None:
    import subprocess
    import sys

    exe = str(Path(sys.executable).with_name("themis-clip"))
    done = subprocess.run(
        [exe, "serve", "--model", str(immich_model), "--port", "0", "--immich-from", "immich"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--immich-from: 'immich' is not a network" in done.stderr


def test_a_model_served_by_its_immich_name(env: dict[str, str], photos: Path) -> None:
    """Pulled by catalogue name (from the Hub stand-in, tests/integration/conftest.py), the
    model answers to the name immich's settings hold, with or without immich's prefix."""
    data = next(photos.iterdir()).read_bytes()
    with hub_serve(env, "--model", MODEL) as s:
        for name in (MODEL, f"immich-app/{MODEL}"):
            assert clip_vector(predict_image(s.base, data, visual_entries(name))).shape == (32,)
            assert clip_vector(predict_text(s.base, "a dog", textual_entries("en", name))).size
        assert predict_image(s.base, data, visual_entries("RN50__openai")).status_code == 404
