from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from themis_clip import OnnxClipPlugin, PluginNotFoundError, available_backends, load_backend


def test_onnx_clip_is_registered() -> None:
    assert "onnx_clip" in available_backends()
    backend = load_backend("onnx_clip")
    assert isinstance(backend, OnnxClipPlugin)
    assert backend.get_info().name == "onnx_clip"


def test_unknown_backend() -> None:
    with pytest.raises(PluginNotFoundError, match="no image plugin named 'nope'.*onnx_clip"):
        load_backend("nope")


def install_fake_distribution(root: Path, entry: str) -> None:
    """A minimal installed distribution (dist-info + module) registering one entry point."""
    (root / "fakeplug_mod.py").write_text(
        textwrap.dedent("""
        from themis_clip.interface import ImageAnalysisBackend, PluginInfo

        class FakeBackend(ImageAnalysisBackend):
            def get_info(self): return PluginInfo(name="fake", version="9.9", description="test")
            def initialize(self, config, backend=None): return True
            def shutdown(self): pass
            def is_ready(self): return True
            def get_backend(self): return "cpu"
            def generate_embedding(self, image_data, metadata=None): raise NotImplementedError
            def generate_embedding_batch(self, images): return []
            def health_check(self): return True
            def warmup(self): return {}
            def get_statistics(self): return {}

        class NotABackend:
            pass
    """)
    )
    dist = root / "fakeplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[themis.image_plugins]\n{entry}\n")


def test_third_party_backend_is_found_through_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_distribution(
        tmp_path,
        "fake = fakeplug_mod:FakeBackend\nbroken = fakeplug_mod:NotABackend\n"
        "missing = no_such_module:X",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert {"fake", "broken", "missing", "onnx_clip"} <= set(available_backends())
    fake = load_backend("fake")
    assert fake.get_info().name == "fake"
    with pytest.raises(PluginNotFoundError, match="not an ImageAnalysisBackend"):
        load_backend("broken")
    with pytest.raises(PluginNotFoundError, match="failed to load"):
        load_backend("missing")
