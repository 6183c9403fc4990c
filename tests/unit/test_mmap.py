"""Memory-mapped loading (seed §9.2), the equivalents of OCP-MM-01..12."""

from __future__ import annotations

import json
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.helpers import photo_like
from themis_clip import OnnxClipPlugin, PluginConfig
from themis_clip.models.external_data import ALIGNMENT

IMAGES = [photo_like(50 + 3 * i, 40 + 5 * i, 200 + i) for i in range(8)]
TEXTS = ["a red circle", "a small blue square on the left", ""]


def cfg(path: Path, **kw: Any) -> PluginConfig:
    model = {
        "path": str(path),
        **{k: kw.pop(k) for k in list(kw) if k in ("enable_mmap_loading", "mmap_cache_dir")},
    }
    return PluginConfig.from_dict({"model": model, **kw})


@pytest.fixture
def model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


def start(config: PluginConfig) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(config), p.last_error
    return p


def maps_of(path_fragment: str) -> int:
    with open("/proc/self/maps") as fh:
        return sum(path_fragment in line for line in fh)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_mm01_initialise_maps_page_aligned_weights(model: Path) -> None:
    p = start(cfg(model, enable_mmap_loading=True))
    stats = p.get_statistics()
    assert stats["loading_mode"] == "mmap" and stats["loading_note"] is None
    entries = sorted((model / ".themis-mmap").iterdir())
    assert [e.name.split("-")[0] for e in entries] == ["textual", "visual"]
    for entry in entries:
        meta = json.loads((entry / "meta.json").read_text())
        assert meta["alignment"] == ALIGNMENT
        graph = onnx.load(str(entry / "model.onnx"), load_external_data=False)
        offsets = [
            int(e.value)
            for t in graph.graph.initializer
            for e in t.external_data
            if e.key == "offset"
        ]
        assert offsets and all(o % ALIGNMENT == 0 for o in offsets)
    assert maps_of("weights.bin") >= 2  # ONNX Runtime really maps the weights files
    p.shutdown()


def test_mm02_unwritable_cache_falls_back_to_path(model: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    p = start(cfg(model, enable_mmap_loading=True, mmap_cache_dir=str(blocker / "cache")))
    stats = p.get_statistics()
    assert stats["loading_mode"] == "path"
    assert "not writable" in stats["loading_note"]
    assert p.generate_embedding(IMAGES[0]).ok
    p.shutdown()


def test_mm03_missing_onnx_package_falls_back(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The conversion subprocess cannot import onnx: loading falls back and says why.
    shadow = tmp_path / "shadow" / "onnx"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no onnx here')\n")
    monkeypatch.setenv(
        "PYTHONPATH", str(shadow.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    p = start(cfg(model, enable_mmap_loading=True))
    assert p.get_statistics()["loading_mode"] == "path"
    assert "themis-onnx-clip[mmap]" in p.get_statistics()["loading_note"]
    p.shutdown()


def test_mm04_errors(model: Path, tmp_path: Path) -> None:
    p = OnnxClipPlugin()
    assert not p.initialize(cfg(tmp_path / "missing", enable_mmap_loading=True))
    assert "not found" in (p.last_error or "")
    (model / "visual.onnx").write_bytes(b"\x08\x01garbage")
    assert not p.initialize(cfg(model, enable_mmap_loading=True))
    assert "cannot load" in (p.last_error or "")


@pytest.fixture
def pair(model: Path):  # type: ignore[no-untyped-def]
    mapped = start(cfg(model, enable_mmap_loading=True))
    # Same kernels as mmap mode (ORT's weight prepacking off), weights read into the heap.
    heap = start(cfg(model, prepack_weights=False))
    default = start(cfg(model))
    yield mapped, heap, default
    for p in (mapped, heap, default):
        p.shutdown()


def test_mm05_single_identical(pair: tuple[OnnxClipPlugin, ...]) -> None:
    for img in IMAGES:
        a, b, c = (p.generate_embedding(img).embedding for p in pair)
        assert np.array_equal(a, b)
        assert np.abs(a - c).max() < 1e-6  # type: ignore[operator]


def test_mm06_batch_of_8_identical(pair: tuple[OnnxClipPlugin, ...]) -> None:
    mapped, heap, _ = pair
    for a, b in zip(
        mapped.generate_embedding_batch(IMAGES), heap.generate_embedding_batch(IMAGES), strict=True
    ):
        assert a.ok and np.array_equal(a.embedding, b.embedding)


def test_mm07_text_identical(pair: tuple[OnnxClipPlugin, ...]) -> None:
    mapped, heap, _ = pair
    for a, b in zip(
        mapped.generate_text_embedding_batch(TEXTS),
        heap.generate_text_embedding_batch(TEXTS),
        strict=True,
    ):
        assert a.ok and np.array_equal(a.embedding, b.embedding)


def test_mm08_concurrent_identical(pair: tuple[OnnxClipPlugin, ...]) -> None:
    mapped, heap, _ = pair
    expected = [heap.generate_embedding(i).embedding for i in IMAGES]
    barrier = threading.Barrier(4)

    def worker(k: int) -> bool:
        barrier.wait()
        return all(
            np.array_equal(
                mapped.generate_embedding(IMAGES[(k + n) % 8]).embedding, expected[(k + n) % 8]
            )
            for n in range(16)
        )

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(worker, range(4)))


@pytest.mark.slow
def test_mm09_map_lives_exactly_as_long_as_the_session(
    model: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    other = Path(shutil.copytree(tiny_model_dir_b, tmp_path / "other"))
    p = start(cfg(model, enable_mmap_loading=True))
    assert maps_of(str(model / ".themis-mmap")) >= 2
    assert p.reload_model(cfg(other, enable_mmap_loading=True, allow_embedding_space_change=True))
    assert maps_of(str(model / ".themis-mmap")) == 0  # the old model's maps are gone after the swap
    assert maps_of(str(other / ".themis-mmap")) >= 2
    p.shutdown()
    assert maps_of(str(other / ".themis-mmap")) == 0


def test_mm10_no_leaked_file_descriptors(model: Path) -> None:
    start(cfg(model, enable_mmap_loading=True)).shutdown()  # cache warm, lazy imports done
    before = fd_count()
    for _ in range(5):
        p = start(cfg(model, enable_mmap_loading=True))
        p.generate_embedding_batch(IMAGES)
        p.shutdown()
    assert fd_count() == before


@pytest.mark.slow
def test_mm11_cache_reused_and_invalidated(model: Path) -> None:
    start(cfg(model, enable_mmap_loading=True)).shutdown()
    entries = {
        e.name: (e / "meta.json").stat().st_mtime_ns for e in (model / ".themis-mmap").iterdir()
    }
    start(cfg(model, enable_mmap_loading=True)).shutdown()
    assert {
        e.name: (e / "meta.json").stat().st_mtime_ns for e in (model / ".themis-mmap").iterdir()
    } == entries
    # A changed source file gets a new entry (keyed by its SHA-256), never the stale one.
    import onnx as onnx_mod

    m = onnx_mod.load(str(model / "visual.onnx"))
    m.doc_string = "changed"
    onnx_mod.save(m, str(model / "visual.onnx"))
    start(cfg(model, enable_mmap_loading=True)).shutdown()
    visual = [e for e in (model / ".themis-mmap").iterdir() if e.name.startswith("visual")]
    assert len(visual) == 2


@pytest.mark.slow
def test_mm11b_corrupt_cache_entry_is_rebuilt(model: Path) -> None:
    start(cfg(model, enable_mmap_loading=True)).shutdown()
    (entry,) = [e for e in (model / ".themis-mmap").iterdir() if e.name.startswith("visual")]
    with open(entry / "weights.bin", "r+b") as fh:
        fh.truncate(10)
    p = start(cfg(model, enable_mmap_loading=True))
    assert p.get_statistics()["loading_mode"] == "mmap" and p.generate_embedding(IMAGES[0]).ok
    p.shutdown()


@pytest.mark.slow
def test_mm12_concurrent_requests_during_reloads_with_mmap(
    model: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    other = Path(shutil.copytree(tiny_model_dir_b, tmp_path / "other"))
    p = start(cfg(model, enable_mmap_loading=True))
    stop = threading.Event()
    failures: list[str] = []

    def client() -> None:
        while not stop.is_set():
            for r in p.generate_embedding_batch(IMAGES):
                if not r.ok:
                    failures.append(r.error or "")

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client) for _ in range(4)]
        for i in range(6):
            target = other if i % 2 == 0 else model
            assert p.reload_model(
                cfg(target, enable_mmap_loading=True, allow_embedding_space_change=True)
            )
        stop.set()
        for f in futures:
            f.result()
    assert not failures
    p.shutdown()
