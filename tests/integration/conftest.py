"""Fixtures of the Hub tests (``test_hub.py``, ``test_hostile_hub.py``): tiny repos in each
layout, a loopback Hub stand-in serving them, and an environment pointing the client at it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import photo_like
from tests.hub_server import FakeHub
from tests.hubtools import IMMICH, fastembed_repos, immich_repo, xenova_repo
from themis_clip.export.tiny import build_model_dir


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("repos")
    ours = build_model_dir(base / "ours", name="tiny-hub", seed=0)
    tok = ours / "tokenizer.json"
    vision, text = fastembed_repos(base / "fastembed", tok)
    return {
        "ours": ours,
        "immich": immich_repo(base / "immich", tok),
        "xenova": xenova_repo(base / "xenova", tok),
        "fe_vision": vision,
        "fe_text": text,
    }


@pytest.fixture
def hub(repos: dict[str, Path]) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add(IMMICH, repos["immich"])
        server.add("Xenova/clip-vit-base-patch32", repos["xenova"])
        server.add("Qdrant/clip-ViT-B-32-vision", repos["fe_vision"])
        server.add("Qdrant/clip-ViT-B-32-text", repos["fe_text"])
        server.add("someone/tiny-themis", repos["ours"])
        yield server


@pytest.fixture
def env(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_CACHE=str(tmp_path / "hf-cache"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
    )
    return e


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(photo_like(70 + 10 * i, 60, i)).save(folder / f"p{i}.jpg")
    return folder
