"""Hostile and broken input: a correct embedding or a clear error, bounded time, no poisoning."""

from __future__ import annotations

import base64
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.helpers import photo_like
from tests.hostile import TEXT_CORPUS, image_corpus
from themis_clip import OnnxClipPlugin, PluginConfig
from themis_clip.server import ServerSettings, create_app

CORPUS = image_corpus()
# Inputs that must decode (the rest must fail with a message naming the problem).
DECODABLE = {
    "1x1",
    "1x100000",
    "cmyk jpeg",
    "ycck jpeg",
    "16-bit png",
    "palette with transparency",
    "LA png",
    "RGBA png",
    "animated gif",
    "animated webp",
    "multi-page tiff",
    "malformed exif",
    *(f"exif orientation {i}" for i in range(1, 9)),
}
MESSAGES = {
    "zero bytes": "empty",
    "random bytes": "not a recognised image format",
    "truncated jpeg": "truncated or corrupt",
    "truncated png": "truncated or corrupt",
    "png declaring 100000x100000": "above the limit",
    "svg": "not a recognised image format",
    "heic": "not a recognised image format",
    "pdf": "not a recognised image format",
    "png inside a zip": "not a recognised image format",
}


@pytest.fixture(scope="module")
def plugin(tiny_model_dir: Path) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(tiny_model_dir)}}))
    return p


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_library(plugin: OnnxClipPlugin, name: str) -> None:
    t0 = time.perf_counter()
    result = plugin.generate_embedding(CORPUS[name])
    assert time.perf_counter() - t0 < 10, "bounded time"
    if name in DECODABLE:
        assert result.ok, result.error
        assert result.embedding is not None and np.isfinite(result.embedding).all()
    elif name in MESSAGES:
        assert not result.ok and MESSAGES[name] in (result.error or ""), result.error
    elif result.ok:  # corrupt entropy data: Pillow may decode garbage pixels...
        assert result.embedding is not None and np.isfinite(result.embedding).all()
        assert abs(float(np.linalg.norm(result.embedding)) - 1) < 1e-5
    else:  # ...or refuse it: as a decode error naming the problem, never an inference failure
        assert result.error_type in ("ImageDecodeError", "ImageTooLargeError"), result.error_type
        assert result.error and len(result.error) > 10
    assert plugin.generate_embedding(photo_like(40, 30, 1)).ok  # nothing poisoned


def test_the_bomb_is_refused_without_decoding(plugin: OnnxClipPlugin) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    result = plugin.generate_embedding(CORPUS["png declaring 100000x100000"])
    # The memory bound below is the proof; the time bound only says it returns (decoding 10^10
    # pixels could not finish in 5 s), with slack a loaded 2-core machine cannot tip.
    assert not result.ok and time.perf_counter() - t0 < 5
    assert (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000
    )  # KiB: nothing allocated


@pytest.mark.parametrize("name", sorted(TEXT_CORPUS))
def test_text(plugin: OnnxClipPlugin, name: str) -> None:
    t0 = time.perf_counter()
    result = plugin.generate_text_embedding(TEXT_CORPUS[name])
    assert time.perf_counter() - t0 < 5
    assert result.ok and result.embedding is not None and np.isfinite(result.embedding).all()
    assert result.truncated == (name == "100k characters")


def test_batch_of_everything(plugin: OnnxClipPlugin) -> None:
    names = sorted(CORPUS)
    results = plugin.generate_embedding_batch([CORPUS[n] for n in names])
    for name, r in zip(names, results, strict=True):
        assert r.ok or r.error, name
        if name in DECODABLE:
            assert r.ok, (name, r.error)


def test_cli(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, (name, data) in enumerate(sorted(CORPUS.items())):
        (folder / f"{i:02d}-{name.replace(' ', '_')}.png").write_bytes(data)
    exe = str(Path(sys.executable).parent / "themis-clip")
    out = subprocess.run(
        [exe, "embed", str(folder), "--model", str(tiny_model_dir), "-o", str(tmp_path / "e.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        out.returncode == 1 and "Traceback" not in out.stderr
    )  # some failed, named, the rest written
    index = json.loads((tmp_path / "e.json").read_text())
    assert len(index) == len(CORPUS) and sum(i["ok"] for i in index) >= len(DECODABLE)
    assert all(i["ok"] or i["error"] for i in index)
    # argv can carry neither NUL bytes nor lone surrogates: those are covered by the library and HTTP.
    texts = [
        arg
        for t in TEXT_CORPUS.values()
        if "\ud800" not in t and "\x00" not in t
        for arg in ("--text", t)
    ]
    out = subprocess.run(
        [exe, "embed", "--model", str(tiny_model_dir), *texts],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert all(json.loads(line)["ok"] for line in out.stdout.splitlines())


def test_http(tiny_model_dir: Path) -> None:
    settings = ServerSettings(
        plugin_config=PluginConfig.from_dict({"model": {"path": str(tiny_model_dir)}}),
        max_body_bytes=5_000_000,
        warmup=False,
    )
    with TestClient(create_app(settings)) as client:
        for name, data in sorted(CORPUS.items()):
            r = client.post("/embed/image", content=data)
            assert r.status_code in (200, 413, 422), (name, r.status_code, r.text)
            if name in DECODABLE:
                assert r.status_code == 200, (name, r.text)
            else:
                assert "error" in r.json()
            if data:
                oai = client.post(
                    "/v1/embeddings",
                    json={"input": base64.b64encode(data).decode(), "modality": "image"},
                )
                assert oai.status_code == r.status_code, (name, oai.text)
        for name, text in TEXT_CORPUS.items():
            # json.dumps escapes lone surrogates ("\\ud800"): valid JSON a client may send.
            body = json.dumps({"text": text})
            r = client.post(
                "/embed/text", content=body, headers={"content-type": "application/json"}
            )
            if name == "invalid surrogates":  # no Unicode text: the JSON parser's named 400
                assert r.status_code == 400 and "lone surrogate" in r.text, r.text
                continue
            assert r.status_code == 200, (name, r.text)
        assert client.post("/embed/image", content=CORPUS["1x1"]).status_code == 200
