from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from themis_clip import BackendType, ConfigError, PluginConfig, ResizeMode

SEED_JSON = {
    "model": {
        "name": "clip-vit-large-patch14",
        "embedding_dim": 768,
        "path": "/models/clip-vit-l-14.onnx",
        "expected_sha256": "ab" * 32,
        "enable_mmap_loading": True,
    },
    "backend": "cuda",
    "max_batch_size": 64,
}


def test_seed_json_is_accepted_exactly() -> None:
    config = PluginConfig.from_json(json.dumps(SEED_JSON))
    assert config.model.name == "clip-vit-large-patch14"
    assert config.model.embedding_dim == 768
    assert config.model.path == "/models/clip-vit-l-14.onnx"
    assert config.model.expected_sha256 == "ab" * 32
    assert config.model.enable_mmap_loading is True
    assert config.backend is BackendType.CUDA
    assert config.max_batch_size == 64


def test_defaults_and_extra_keys() -> None:
    config = PluginConfig.from_dict(
        {
            "model": {"path": "m", "text_path": "t.onnx", "variant": "int8"},
            "intra_op_threads": 2,
            "preprocess_workers": 3,
            "prefetch_batches": 0,
            "preprocess": {
                "image_size": 336,
                "resize_mode": "squash",
                "mean": [0.5, 0.5, 0.5],
                "std": [0.5, 0.5, 0.5],
                "apply_exif": False,
                "max_image_pixels": 1000,
            },
            "tensorrt": {"cache_dir": "/tmp/trt", "fp16": True},
            "drain_timeout_s": 5,
            "allow_embedding_space_change": True,
        }
    )
    assert config.backend is BackendType.AUTO
    assert config.max_batch_size == 32
    assert config.model.text_path == "t.onnx"
    assert config.preprocess.resize_mode is ResizeMode.SQUASH
    assert config.preprocess.mean == (0.5, 0.5, 0.5)
    assert config.preprocess.apply_exif is False
    assert PluginConfig.from_dict({"model": {"path": "m"}}).preprocess.decode_mode == "fast"
    assert config.tensorrt.fp16 is True
    assert config.drain_timeout_s == 5.0
    assert config.allow_embedding_space_change is True
    assert config.prefetch_batches == 0
    assert PluginConfig.from_dict({"model": {"path": "m"}}).prefetch_batches == 1


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({}, "model"),
        ({"model": {}}, "model.path"),
        ({"model": {"path": 3}}, "model.path"),
        ({"model": {"path": "m", "embedding_dim": "512"}}, "model.embedding_dim"),
        ({"model": {"path": "m", "embedding_dim": 0}}, "model.embedding_dim"),
        ({"model": {"path": "m", "embedding_dim": True}}, "model.embedding_dim"),
        ({"model": {"path": "m", "expected_sha256": "abc123"}}, "model.expected_sha256"),
        (
            {"model": {"path": "m", "expected_sha256": {"visual.onnx": "zz"}}},
            "model.expected_sha256.visual.onnx",
        ),
        ({"model": {"path": "m", "enable_mmap_loading": "yes"}}, "model.enable_mmap_loading"),
        ({"model": {"path": "m", "pth": "x"}}, "model.pth"),
        ({"model": {"path": "m"}, "backend": "gpu"}, "backend"),
        ({"model": {"path": "m"}, "max_batch_size": -1}, "max_batch_size"),
        ({"model": {"path": "m"}, "max_batch_size": 1.5}, "max_batch_size"),
        ({"model": {"path": "m"}, "preprocess": {"resize_mode": "crop"}}, "preprocess.resize_mode"),
        ({"model": {"path": "m"}, "preprocess": {"mean": [1, 2]}}, "preprocess.mean"),
        ({"model": {"path": "m"}, "preprocess": {"std": [1, 0, 1]}}, "preprocess.std"),
        (
            {"model": {"path": "m"}, "preprocess": {"decode_mode": "turbo"}},
            "preprocess.decode_mode",
        ),
        ({"model": {"path": "m"}, "prefetch_batches": -1}, "prefetch_batches"),
        ({"model": {"path": "m"}, "prefetch_batches": 17}, "prefetch_batches"),
        ({"model": {"path": "m"}, "prefetch_batches": "2"}, "prefetch_batches"),
        ({"model": {"path": "m"}, "drain_timeout_s": -1}, "drain_timeout_s"),
        ({"model": {"path": "m"}, "drain_timeout_s": "30"}, "drain_timeout_s"),
        ({"model": {"path": "m"}, "session": {"run_timeout_s": 0}}, "session.run_timeout_s"),
        ({"model": {"path": "m"}, "session": {"run_timeout_s": "9"}}, "session.run_timeout_s"),
        ({"model": {"path": "m"}, "tensorrt": []}, "tensorrt"),
        (  # an empty path is said, not taken for null (null turns the cache off)
            {"model": {"path": "m"}, "session": {"optimized_model_cache_dir": " "}},
            "session.optimized_model_cache_dir",
        ),
        ({"model": {"path": ""}}, "model.path"),
        ({"model": {"path": "m"}, "openvino": {"precision": "int4"}}, "openvino.precision"),
        ({"model": {"path": "m"}, "openvino": {"device": "CPU; rm"}}, "openvino.device"),
        ({"model": {"path": "m"}, "canary_min_cosine": 1.5}, "canary_min_cosine"),
        ({"model": {"path": "m"}, "canary_min_cosine": "0.9"}, "canary_min_cosine"),
        ({"model": {"path": "m"}, "unknown": 1}, "unknown"),
        ({"model": "m"}, "model"),
    ],
)
def test_bad_values_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        PluginConfig.from_dict(data)
    assert info.value.key == key
    assert key in str(info.value)


def test_not_json_and_not_object() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        PluginConfig.from_json("{model")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        PluginConfig.from_json("[1, 2]")


def test_from_file_resolves_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "plugin.json"
    path.write_text(json.dumps({"model": {"path": "../models/m", "text_path": "/abs/t.onnx"}}))
    config = PluginConfig.from_file(path)
    assert Path(config.model.path) == tmp_path / "conf" / ".." / "models" / "m"
    assert config.model.text_path == "/abs/t.onnx"


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        PluginConfig.from_file(tmp_path / "nope.json")


def test_config_is_frozen() -> None:
    config = PluginConfig.from_dict({"model": {"path": "m"}})
    with pytest.raises(AttributeError):
        config.max_batch_size = 3  # type: ignore[misc]


FULL = {
    "model": {
        "path": "/m",
        "name": "n",
        "embedding_dim": 8,
        "expected_sha256": "a" * 64,
        "enable_mmap_loading": True,
        "text_path": "/t.onnx",
        "tokenizer_path": "/tok.json",
        "variant": "int8",
        "mmap_cache_dir": "/c",
    },
    "backend": "openvino",
    "max_batch_size": 7,
    "intra_op_threads": 3,
    "preprocess_workers": 2,
    "prefetch_batches": 0,
    "preprocess": {
        "image_size": 96,
        "mean": [0.1, 0.2, 0.3],
        "std": [0.4, 0.5, 0.6],
        "resize_mode": "squash",
        "apply_exif": False,
        "max_image_pixels": 1000,
        "decode_mode": "exact",
        "max_pixels_in_flight": 5000,
    },
    "tensorrt": {"cache_dir": "/trt", "fp16": True},
    "openvino": {"device": "GPU.1", "precision": "bf16"},
    "canary_min_cosine": 0.999,
    "session": {
        "optimization_level": "basic",
        "optimized_model_cache_dir": "/o",
        "cpu_mem_arena": False,
        "allow_spinning": True,
        "run_timeout_s": 12.5,
    },
    "device_id": 1,
    "drain_timeout_s": 2.5,
    "allow_embedding_space_change": False,
    "prepack_weights": True,
    "search": {
        "index": "/idx.db",
        "target_recall": 0.95,
        "graph_dtype": "f16",
        "rescore": 4,
        "sample": 500,
        "exact_fast_ms": 2.0,
    },
    "ocr": {
        "enabled": True,
        "models": "/ocr",
        "gate": False,
        "gate_side": 256,
        "detection_side": 960,
        "box_threshold": 0.6,
        "min_confidence": 0.7,
    },
}


def test_raw_is_lossless_and_dotted_access_works() -> None:
    config = PluginConfig.from_dict(FULL)
    assert config.raw() == FULL  # every non-default setting survives
    assert PluginConfig.from_dict(json.loads(json.dumps(config.raw()))) == config
    default = PluginConfig.from_dict({"model": {"path": "/m"}})
    assert PluginConfig.from_dict(default.raw()) == default
    assert config.get("preprocess.decode_mode") == "exact"
    assert config.get("model.expected_sha256") == "a" * 64
    assert config.get("model.nope", 5) == 5 and config.get("backend.deeper") is None
    assert config.has("session.allow_spinning") and not config.has("session.nope")


def test_one_strict_json_rule_for_config_manifest_and_peers(tmp_path: Path) -> None:
    from themis_clip.errors import ModelFormatError
    from themis_clip.models.layout import resolve_model

    for text in ('{"model": {"path": "/m"}, "drain_timeout_s": NaN}', '{"model": {}, "model": {}}'):
        with pytest.raises(ConfigError, match="not valid JSON"):
            PluginConfig.from_json(text)
    with pytest.raises(ConfigError, match="preprocess.mean"):
        PluginConfig.from_dict({"model": {"path": "/m"}, "preprocess": {"mean": [True, 0.5, 0.5]}})
    model = tmp_path / "m"
    model.mkdir()
    (model / "visual.onnx").write_bytes(b"x")
    base = '{"format": "themis-clip-model", "format_version": 1, "visual": {%s}}'
    for body, why in (
        ('"mean": [true, 0.5, 0.5]', "three numbers"),
        ('"mean": [NaN, 0.5, 0.5]', "NaN"),
    ):
        (model / "manifest.json").write_text(base % body)
        with pytest.raises(ModelFormatError, match=why):
            resolve_model(str(model))


def test_search_section_takes_a_url_or_a_path_relative_to_the_file(tmp_path: Path) -> None:
    url = "postgresql://u@db/photos"
    config = PluginConfig.from_dict({"model": {"path": "/m"}, "search": {"index": url}})
    assert config.search.index == url and config.search.graph_dtype == "i8"
    (tmp_path / "c.json").write_text(
        json.dumps({"model": {"path": "/m"}, "search": {"index": "i.db"}})
    )
    assert PluginConfig.from_file(tmp_path / "c.json").search.index == str(tmp_path / "i.db")
    with pytest.raises(ConfigError, match="search.target_recall"):
        PluginConfig.from_dict({"model": {"path": "/m"}, "search": {"target_recall": 2}})
    with pytest.raises(ConfigError, match="search.graph_dtype"):
        PluginConfig.from_dict({"model": {"path": "/m"}, "search": {"graph_dtype": "f64"}})
    with pytest.raises(ConfigError, match="search.nope"):
        PluginConfig.from_dict({"model": {"path": "/m"}, "search": {"nope": 1}})
    with pytest.raises(ConfigError, match="rescore >= 1"):  # the tuner's settings, one type
        PluginConfig.from_dict({"model": {"path": "/m"}, "search": {"rescore": 0}})


def test_the_ocr_section_is_read_and_checked(tmp_path: Path) -> None:
    base = {"model": {"path": "m.onnx"}}
    assert PluginConfig.from_dict(base).ocr.enabled is False
    hub = PluginConfig.from_dict({**base, "ocr": {"models": "immich-app/PP-OCRv5_mobile"}})
    assert hub.ocr.models == "immich-app/PP-OCRv5_mobile"  # a Hub name stays a name
    (tmp_path / "ocr").mkdir()  # an existing folder wins, relative to the config file
    config = PluginConfig.from_dict(
        {**base, "ocr": {"enabled": True, "models": "ocr", "gate": False, "detection_side": 960}},
        base_dir=tmp_path,
    )
    assert config.ocr.enabled and not config.ocr.gate and config.ocr.detection_side == 960
    assert config.ocr.models == str(tmp_path / "ocr")
    assert PluginConfig.from_dict(config.raw()) == config
    with pytest.raises(ConfigError, match="ocr.detection_side"):
        PluginConfig.from_dict({**base, "ocr": {"detection_side": 8}})
    with pytest.raises(ConfigError, match="ocr.min_confidence"):
        PluginConfig.from_dict({**base, "ocr": {"min_confidence": 2}})
    with pytest.raises(ConfigError, match="ocr.gat"):
        PluginConfig.from_dict({**base, "ocr": {"gat": True}})


@pytest.mark.parametrize("key", ["intra_op_threads", "preprocess_workers"])
def test_thread_counts_are_bounded(key: str) -> None:
    # Each counted thread is an OS thread: 100000 of them froze a machine.
    assert getattr(PluginConfig.from_dict({"model": {"path": "m"}, key: 1024}), key) == 1024
    with pytest.raises(ConfigError, match=rf"{key}.*at most 1024, got 100000"):
        PluginConfig.from_dict({"model": {"path": "m"}, key: 100000})


def test_migrate_refuses_a_thread_count_no_machine_has(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from themis_clip.cli import main

    code = main(["migrate", "--index", str(tmp_path / "i.db"), "--to", "m", "--threads", "100000"])
    assert code == 2
    cores = os.cpu_count()
    assert f"--threads must be between 1 and {cores} (the cores here), got 100000" in (
        capsys.readouterr().err
    )
