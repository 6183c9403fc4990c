"""A request's vector is the same whoever shares its batch: every variant, through the server."""

from __future__ import annotations

import io
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import ServerProcess, photo_like

pytest.importorskip("onnx")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quantised(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from themis_clip.export.quantize import add_int8_variant

    out = tmp_path_factory.mktemp("q") / "tiny"
    shutil.copytree(tiny_model_dir, out)
    add_int8_variant(out)
    return out


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo_like(40 + seed % 7, 36 + seed % 5, seed)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_vectors_do_not_depend_on_batch_mates(
    quantised: Path, tmp_path: Path, variant: str
) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"model": {"path": str(quantised), "variant": variant}, "max_batch_size": 16})
    )
    images = [png(i) for i in range(24)]
    with (
        ServerProcess(
            ["--config", str(config), "--max-queue-delay-ms", "30", "--no-warmup"]
        ) as server,
        httpx.Client(base_url=server.base, timeout=60) as c,
    ):
        alone = [np.asarray(c.post("/embed/image", content=d).json()["embedding"]) for d in images]
        before = c.get("/stats").json()["batches"]

        def post(data: bytes) -> np.ndarray:
            r = httpx.post(f"{server.base}/embed/image", content=data, timeout=60)
            assert r.status_code == 200, r.text
            return np.asarray(r.json()["embedding"])

        with ThreadPoolExecutor(24) as pool:  # concurrent strangers: dynamic batches
            together = list(pool.map(post, images))
        stats = c.get("/stats").json()
    assert stats["batches"] - before < len(images), "requests were never batched together"
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert np.array_equal(a, b), f"image {i}: its vector depends on its batch-mates"
