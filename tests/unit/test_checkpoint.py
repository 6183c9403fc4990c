"""A checkpoint's config checked against its safetensors header, before anything is built."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from themis_clip.errors import ModelFormatError
from themis_clip.models.checkpoint import check_checkpoint, safetensors_shapes


def write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    header = {n: {"dtype": "F32", "shape": s, "data_offsets": [0, 0]} for n, s in tensors.items()}
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


TENSORS = {
    "vision_model.encoder.layers.0.mlp.fc1.weight": [256, 64],
    "vision_model.encoder.layers.1.mlp.fc1.weight": [256, 64],
    "text_model.encoder.layers.0.mlp.fc1.weight": [128, 32],
    "text_model.encoder.layers.1.mlp.fc1.weight": [128, 32],
}
VISION = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 256}
TEXT = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 128}


def checkpoint(tmp_path: Path, **config: Any) -> Path:
    write_safetensors(tmp_path / "model.safetensors", TENSORS)
    body = {"model_type": "clip", "vision_config": VISION, "text_config": TEXT, **config}
    (tmp_path / "config.json").write_text(json.dumps(body))
    return tmp_path


def test_a_config_matching_its_weights_passes(tmp_path: Path) -> None:
    check_checkpoint(checkpoint(tmp_path))
    shapes = safetensors_shapes(tmp_path / "model.safetensors")
    assert shapes["text_model.encoder.layers.1.mlp.fc1.weight"] == (128, 32)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"vision_config": {**VISION, "num_hidden_layers": 1_000_000}}, "num_hidden_layers is"),
        ({"text_config": {**TEXT, "num_hidden_layers": 3}}, "holds 2 text_model layers"),
        ({"vision_config": {**VISION, "hidden_size": 4096}}, "vision_config.hidden_size is 4096"),
        ({"text_config": {**TEXT, "intermediate_size": 99}}, "intermediate_size is 99"),
        ({"projection_dim": 10**9}, "projection_dim is 1000000000"),
        ({"text_config": {**TEXT, "vocab_size": 2**40}}, "vocab_size is"),
    ],
)
def test_a_config_bomb_is_refused(tmp_path: Path, config: dict[str, Any], needle: str) -> None:
    with pytest.raises(ModelFormatError, match=needle):
        check_checkpoint(checkpoint(tmp_path, **config))


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xff" * 8, struct.pack("<Q", 10**12) + b"{}", struct.pack("<Q", 4) + b"[1]x"],
    ids=["empty", "huge-length", "length-past-bound", "not-an-object"],
)
def test_a_broken_safetensors_header_is_refused(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "model.safetensors").write_bytes(raw)
    with pytest.raises(ModelFormatError):
        safetensors_shapes(tmp_path / "model.safetensors")


def test_an_oversized_config_and_a_pickle_are_refused(tmp_path: Path) -> None:
    checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(" " * (2 * 1024**2) + "{}")
    with pytest.raises(ModelFormatError, match="not a config"):
        check_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ModelFormatError, match="holds code") as caught:
        check_checkpoint(tmp_path)
    assert "weights_only" not in str(caught.value)
