from __future__ import annotations

import importlib
import inspect

import themis_clip
from themis_clip import errors


def test_all_is_sorted_and_complete() -> None:
    names = themis_clip.__all__

    def group(name: str) -> tuple[int, str]:  # constants, classes, functions (ruff RUF022)
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert names == sorted(names, key=group)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(themis_clip, name), name


def test_every_error_is_exported_and_in_the_tree() -> None:
    for name, obj in inspect.getmembers(errors, inspect.isclass):
        if issubclass(obj, Exception) and obj.__module__ == errors.__name__:
            assert issubclass(obj, errors.ThemisClipError)
            assert name in themis_clip.__all__, name
            assert name in (errors.__doc__ or ""), f"{name} missing from the tree drawing"


def test_every_lazy_export_resolves_to_its_home() -> None:
    homes = themis_clip._HOMES
    assert set(homes) == set(themis_clip.__all__) - {"__version__"}
    for name, home in homes.items():
        assert getattr(themis_clip, name) is vars(importlib.import_module(home))[name], name
    assert "OnnxClipPlugin" in dir(themis_clip)


def test_seed_method_names_exist() -> None:
    plugin = themis_clip.OnnxClipPlugin()
    for name in (
        "get_info",
        "initialize",
        "shutdown",
        "is_ready",
        "get_backend",
        "generate_embedding",
        "generate_embedding_batch",
        "generate_text_embedding",
        "generate_text_embedding_batch",
        "health_check",
        "warmup",
        "get_statistics",
        "reload_model",
    ):
        assert callable(getattr(plugin, name))
    # the model-only accessors beside the seed's calls (tests and tools read these, not internals)
    for name in ("preprocess", "tokenize", "embed_pixels", "embed_tokens", "classify", "rank"):
        assert callable(getattr(plugin, name))
    assert plugin.model_spec is None and plugin.model_identity is None  # nothing loaded yet
    info = plugin.get_info()
    assert info.name == "onnx_clip"
    assert info.version == themis_clip.__version__
    assert "image_embedding" in info.capabilities
    assert isinstance(plugin, themis_clip.ImageAnalysisBackend)
