"""The pull's guards that need no Hub: the export child's limits, eviction inside the cache."""

from __future__ import annotations

import sys
from pathlib import Path

from themis_clip.models.hub.pull import _evict, _run_limited


def test_a_runaway_child_is_stopped_by_its_limits() -> None:
    eat = [sys.executable, "-c", "x = bytearray(3 * 1024**3)"]
    why = _run_limited(eat, 1024**3, 60)
    assert why is not None and "memory limit of 1024 MiB" in why
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    why = _run_limited(sleep, 1024**3, 0.5)
    assert why is not None and "time limit" in why
    assert _run_limited([sys.executable, "-c", "pass"], 1024**3, 60) is None


def test_eviction_deletes_blobs_of_the_cache_only(tmp_path: Path) -> None:
    storage = tmp_path / "models--org--name"
    blob = storage / "blobs" / ("a" * 64)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"x")
    outside = tmp_path / "keys.txt"
    outside.write_bytes(b"keep me")
    snapshot = storage / "snapshots" / ("b" * 40) / "visual"
    snapshot.mkdir(parents=True)
    (snapshot / "model.onnx").symlink_to(blob)
    (snapshot / "foreign.onnx").symlink_to(outside)  # a link some other tool left
    _evict(snapshot / "model.onnx")
    _evict(snapshot / "foreign.onnx")
    assert not blob.exists() and not (snapshot / "model.onnx").is_symlink()
    assert outside.read_bytes() == b"keep me" and not (snapshot / "foreign.onnx").is_symlink()
