"""The one image decode path (``themis_clip.pipeline``): files named ahead
(``OnnxClipPlugin.prefetch``, the indexer's prefetch hook) decode while the session opens, in the
plugin's threads and pixel budget, and the vectors stay the plugin's to the bit."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.fakes import STAMP, FakeEmbedder, photo_like, write_png
from themis_clip import IndexModelMismatchError, OnnxClipPlugin
from themis_clip.config import ModelConfig, PluginConfig
from themis_clip.index.indexer import index_folder
from themis_clip.index.search import VectorIndex
from themis_clip.interface import EmbeddingResult
from themis_clip.loading import declared_preprocessor
from themis_clip.vocabulary import ModelIdentity


def jpegs(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"{i:02d}.jpg"
        Image.fromarray(photo_like(96 + 8 * i, 72, i)).save(path, quality=90)
        paths.append(path)
    return paths


def vectors(results: list[EmbeddingResult]) -> list[np.ndarray | None]:
    return [r.embedding if r.ok else None for r in results]


def test_declared_preprocessor_is_the_loaded_models(
    plugin: OnnxClipPlugin, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = PluginConfig(model=ModelConfig(path=str(tiny_model_dir)))
    early = declared_preprocessor(config)  # no session opened for this
    assert early is not None and early.spec.image_size == 32
    assert plugin.config is not None and plugin.model_spec is not None
    assert early == declared_preprocessor(plugin.config, spec=plugin.model_spec)
    assert early.shape == plugin.preprocess(write_and(tmp_path / "a.png")).shape
    # not resolvable here: None, and load_model is the one that says why
    missing = PluginConfig(model=ModelConfig(path=str(tmp_path / "nowhere")))
    assert declared_preprocessor(missing) is None


def write_and(path: Path) -> Path:
    write_png(path, 3)
    return path


def preprocess_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("themis-preprocess")}


def test_files_named_ahead_decode_before_the_model_opens_and_give_its_vectors_to_the_bit(
    plugin: OnnxClipPlugin, tiny_model_dir: Path, tmp_path: Path
) -> None:
    paths = jpegs(tmp_path / "p", 11)
    broken = tmp_path / "p" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really a JPEG")
    stranger = jpegs(tmp_path / "q", 1)[0]  # never named to prefetch
    config = PluginConfig(model=ModelConfig(path=str(tiny_model_dir)), max_batch_size=4)
    plugin.initialize(config)
    items = [*paths[:5], broken, *paths[5:]]
    expected = plugin.generate_embedding_batch(items[:7]) + plugin.generate_embedding_batch(
        [*items[7:], stranger]
    )
    early = OnnxClipPlugin()
    before = preprocess_threads()
    try:
        early.prefetch(items, config)
        assert not early.is_ready() and preprocess_threads() - before  # decoding, no model
        # ... against the plugin's one budget, of the user's size
        deadline = time.monotonic() + 30
        while early.pixel_budget.stats()["peak"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = early.pixel_budget.stats()
        assert stats["capacity"] == config.preprocess.pixel_budget and stats["peak"] > 0
        assert early.initialize(config)
        got = early.generate_embedding_batch(items[:7])
        got += early.generate_embedding_batch([*items[7:], stranger])
    finally:
        early.shutdown()
    assert [r.ok for r in got] == [r.ok for r in expected]
    assert not got[5].ok and type(got[5].error) is type(expected[5].error)
    for a, b in zip(vectors(got), vectors(expected), strict=True):
        assert (a is None and b is None) or np.array_equal(a, b)


def test_files_named_ahead_but_not_asked_are_skipped_and_other_preprocessing_decodes_again(
    plugin: OnnxClipPlugin, tiny_model_dir: Path, tmp_path: Path
) -> None:
    paths = jpegs(tmp_path / "p", 6)
    expected = plugin.generate_embedding_batch(paths)
    plugin.prefetch(paths)
    got = plugin.generate_embedding_batch(paths[2:])  # the first two never asked for
    assert all(
        np.array_equal(a, b) for a, b in zip(vectors(got), vectors(expected[2:]), strict=True)
    )
    # named with a configuration whose declared size is not the model's: decoded again
    config = PluginConfig(model=ModelConfig(path=str(tiny_model_dir)))
    other = replace(config, preprocess=replace(config.preprocess, image_size=48))
    plugin.prefetch(paths, other)
    got = plugin.generate_embedding_batch(paths)
    plugin.prefetch(())
    assert all(np.array_equal(a, b) for a, b in zip(vectors(got), vectors(expected), strict=True))


class Recording(FakeEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.prefetched: list[list[str]] = []

    def prefetch(self, paths: Sequence[Path]) -> None:
        self.prefetched.append([os.fspath(p) for p in paths])


def test_prefetch_names_exactly_what_is_embedded_and_the_stamp_comes_after(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "photos"
    for i in range(6):
        write_png(folder / f"{i}.png", i)
    embedder = Recording()
    calls: list[str] = []

    def stamp() -> ModelIdentity:
        calls.append(f"stamp after {len(embedder.prefetched)} prefetch")
        return STAMP

    with VectorIndex(tmp_path / "i.db") as index:
        r = index_folder(index, folder, embedder, stamp=stamp, chunk=4, prefetch=embedder.prefetch)
        assert r.added == 6 and calls == ["stamp after 1 prefetch"]
        assert embedder.prefetched[-1] == embedder.embedded
        # a rename, a duplicate of an indexed file, two copies of a new file, a change
        os.rename(folder / "0.png", folder / "zero.png")
        (folder / "copy-of-2.png").write_bytes((folder / "2.png").read_bytes())
        write_png(folder / "new.png", 77)
        (folder / "new-copy.png").write_bytes((folder / "new.png").read_bytes())
        write_png(folder / "4.png", 444)
        embedder.embedded.clear()
        r = index_folder(index, folder, embedder, stamp=stamp, prefetch=embedder.prefetch)
        assert (r.renamed, r.duplicates, r.updated, r.added) == (1, 2, 1, 1)
        assert embedder.prefetched[-1] == embedder.embedded
        # the changed file and the first in walk order of the two new copies
        assert sorted(Path(p).name for p in embedder.embedded) == ["4.png", "new-copy.png"]


def test_a_deferred_stamp_of_another_model_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    for i in range(3):
        write_png(folder / f"{i}.png", i)
    with VectorIndex(tmp_path / "i.db") as index:
        index_folder(index, folder, FakeEmbedder(), stamp=STAMP)
        os.rename(folder / "0.png", folder / "moved.png")
        other = ModelIdentity.from_model_id("other@1", sha256="cd" * 32, dim=STAMP.dim)
        with pytest.raises(IndexModelMismatchError, match="Re-index"):
            index_folder(index, folder, FakeEmbedder(), stamp=lambda: other)
        assert index.store.get(str((folder / "0.png").resolve())) is not None  # not renamed
