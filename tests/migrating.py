"""What the migration tests share: the admin key, the model's id, a load of searches and
writes against a server, and a model that counts (or slows) what it embeds."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from tests.helpers import make_plugin, photo_like
from themis_clip import ModelConfig, PluginConfig
from themis_clip.collection import Collection
from themis_clip.interface import EmbeddingResult, ImageData

TOKEN = "migrate-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
TEXTS = ["a photo of a dog", "a red car", "mountains at dusk"]
K = 10


def _config(model: Path) -> PluginConfig:
    return PluginConfig(model=ModelConfig(path=str(model)))


def _search(c: httpx.Client, text: str) -> dict[str, Any]:
    r = c.post("/search", json={"text": text, "k": K, "cut": "none"}, headers=ADMIN)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _wait(c: httpx.Client, states: tuple[str, ...], timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status: dict[str, Any] = c.get("/admin/migrate", headers=ADMIN).json()
        if status["state"] in states:
            return status
        assert status["state"] not in ("failed", "cancelled", "blocked"), status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo_like(40, 30, 10_000 + seed)).save(buf, "PNG")
    return buf.getvalue()


class _Load:
    """Searches from two threads and writes from a third until stopped; every answer kept."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.answers: list[tuple[str, str, list[str]]] = []  # (text, model id, keys)
        self.written: list[str] = []
        self.threads = [
            threading.Thread(target=self._searches, args=(0,)),
            threading.Thread(target=self._searches, args=(1,)),
            threading.Thread(target=self._writes),
        ]

    def __enter__(self) -> _Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _searches(self, k: int) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as c:
            n = k
            while not self.stop.is_set():
                text = TEXTS[n % len(TEXTS)]
                n += 1
                r = c.post("/search", json={"text": text, "k": K, "cut": "none"}, headers=ADMIN)
                if r.status_code != 200:
                    self.failures.append(f"search {r.status_code}: {r.text[:300]}")
                    continue
                body = r.json()
                self.answers.append((text, body["model_id"], [h["id"] for h in body["results"]]))

    def _writes(self) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as c:
            n = 0
            while not self.stop.is_set():
                key = f"written-{n}"
                image = base64.b64encode(_png(n)).decode()
                r = c.post(
                    "/index/items",
                    json={"items": [{"id": key, "image": image, "metadata": {"n": n}}]},
                    headers=ADMIN,
                )
                if r.status_code != 200:
                    self.failures.append(f"write {r.status_code}: {r.text[:300]}")
                else:
                    self.written.append(key)
                n += 1
                self.stop.wait(0.05)  # a steady trickle of writes, not a flood


def _model_id(model: Path) -> str:
    plugin = make_plugin(model)
    try:
        assert plugin.model_identity is not None
        return plugin.model_identity.model_id
    finally:
        plugin.shutdown()


_SLOW_MIGRATION = """
import sys, time
from themis_clip.plugin import OnnxClipPlugin
embed = OnnxClipPlugin.generate_embedding_batch
def slowly(self, images):
    time.sleep(0.05)  # a model slow enough to be killed mid-way
    return embed(self, images)
OnnxClipPlugin.generate_embedding_batch = slowly
from themis_clip.cli import main
sys.exit(main(sys.argv[1:]))
"""


class _Counting:
    """The new model, counting what it is asked to embed."""

    def __init__(self, model: Path) -> None:
        self.plugin = make_plugin(model)
        self.seen: list[str] = []

    def generate_embedding_batch(self, images: Sequence[ImageData]) -> list[EmbeddingResult]:
        self.seen += [str(i) for i in images]
        return self.plugin.generate_embedding_batch(images)


def build_library(root: Path, items: int, model: Path, size: tuple[int, int]) -> tuple[Path, Path]:
    """``items`` small photos in ``root/photos`` and their index made by ``model``:
    ``(folder, index)``."""
    photos = root / "photos"
    photos.mkdir()
    digits = len(str(items - 1))  # 000.png … 199.png; 0000.png … 1999.png
    for i in range(items):
        Image.fromarray(photo_like(*size, i)).save(photos / f"{i:0{digits}d}.png")
    index = root / "photos.db"
    with Collection.open(index, _config(model)) as collection:
        assert collection.index_folder(photos).added == items
    return photos, index


def kill_when(proc: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
    """kill -9 ``proc`` once ``ready()`` (the migration committed enough), within 2 minutes."""
    try:
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the migration committed nothing"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
