"""Peers' model directories (REFERENCE.md §3), built here with their names, dtypes and side files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto

from tests.helpers import photo_like
from themis_clip import ModelFormatError, OnnxClipPlugin, PluginConfig, preprocess_image
from themis_clip.export.tiny import (
    TextTowerSpec,
    VisionTowerSpec,
    build_text_tower,
    build_vision_tower,
)
from themis_clip.models.layout import resolve_model
from themis_clip.preprocess.text import CLIPTokenizer

IMAGE = photo_like(90, 70, 5)
TEXT = "a small red circle"


def vocab(tok_file: Path) -> tuple[int, int]:
    tok = CLIPTokenizer(tok_file)
    return len(json.loads(tok_file.read_text())["model"]["vocab"]) + 2, tok.eot_id


def start(path: Path, **model: object) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(path), **model}})), (
        p.last_error
    )
    return p


def raw(session_path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    out = ort.InferenceSession(str(session_path)).run(None, feeds)[0]
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def immich(tmp_path: Path, tiny_model_dir: Path) -> Path:
    root = tmp_path / "ViT-B-32__openai"
    size, eot = vocab(tiny_model_dir / "tokenizer.json")
    build_vision_tower(
        VisionTowerSpec(
            image_size=48, input_name="image", output_name="embedding", batch=1, normalize=True
        ),
        root / "visual" / "model.onnx",
    )
    build_text_tower(
        TextTowerSpec(
            vocab_size=size,
            eot_id=eot,
            input_name="text",
            ids_dtype=TensorProto.INT32,
            output_name="embedding",
            batch=1,
            seq=77,
            normalize=True,
        ),
        root / "textual" / "model.onnx",
    )
    shutil.copy(tiny_model_dir / "tokenizer.json", root / "textual" / "tokenizer.json")
    (root / "textual" / "tokenizer_config.json").write_text(
        json.dumps({"pad_token": "<|endoftext|>"})
    )
    (root / "config.json").write_text(
        json.dumps({"embed_dim": 32, "text_cfg": {"context_length": 77}})
    )
    (root / "visual" / "preprocess_cfg.json").write_text(
        json.dumps(
            {
                "size": [48, 48],
                "mode": "RGB",
                "mean": [0.5, 0.5, 0.5],
                "std": [0.5, 0.5, 0.5],
                "interpolation": "bicubic",
                "resize_mode": "squash",
                "fill_color": 0,
            }
        )
    )
    return root


def test_immich_layout(immich: Path) -> None:
    p = start(immich)
    stats = p.get_statistics()
    assert stats["image_size"] == 48 and stats["embedding_dim"] == 32 and stats["text_tower"]
    assert p.model_spec is not None and p.model_spec.layout == "immich"
    # Preprocessing comes from preprocess_cfg.json: squash to 48, mean = std = 0.5.
    pixels = preprocess_image(
        IMAGE, image_size=48, mean=(0.5,) * 3, std=(0.5,) * 3, resize_mode="squash"
    )
    expected = raw(immich / "visual" / "model.onnx", {"image": pixels[None]})
    batch = p.generate_embedding_batch([IMAGE, IMAGE, IMAGE])  # batch fixed at 1: looped
    for r in batch:
        assert r.ok and np.abs(r.embedding - expected[0]).max() < 1e-5  # type: ignore[operator]
    # Text: int32 ids padded to the fixed 77 with the pad token from tokenizer_config.json (EOT).
    tok = CLIPTokenizer(immich / "textual" / "tokenizer.json")
    assert tok.pad_id == tok.eot_id
    ids, _ = tok.pad(tok.encode_batch([TEXT]).rows, 77, np.dtype(np.int32))
    expected_text = raw(immich / "textual" / "model.onnx", {"text": ids})
    r = p.generate_text_embedding(TEXT)
    assert r.ok and np.abs(r.embedding - expected_text[0]).max() < 1e-5  # type: ignore[operator]
    assert len(p.generate_text_embedding_batch([TEXT, "b", "c"])) == 3


@pytest.fixture
def xenova(tmp_path: Path, tiny_model_dir: Path) -> Path:
    root = tmp_path / "Xenova-clip"
    size, eot = vocab(tiny_model_dir / "tokenizer.json")
    build_vision_tower(VisionTowerSpec(image_size=40, patch=8), root / "onnx" / "vision_model.onnx")
    build_vision_tower(
        VisionTowerSpec(image_size=40, patch=8, seed=3),
        root / "onnx" / "vision_model_quantized.onnx",
    )
    build_text_tower(TextTowerSpec(vocab_size=size, eot_id=eot), root / "onnx" / "text_model.onnx")
    build_text_tower(
        TextTowerSpec(vocab_size=size, eot_id=eot, seed=9),
        root / "onnx" / "text_model_quantized.onnx",
    )
    shutil.copy(tiny_model_dir / "tokenizer.json", root / "tokenizer.json")
    (root / "config.json").write_text(
        json.dumps({"projection_dim": 32, "text_config": {"max_position_embeddings": 77}})
    )
    (root / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "crop_size": {"height": 40, "width": 40},
                "do_center_crop": True,
                "do_normalize": True,
                "do_resize": True,
                "image_mean": [0.4, 0.4, 0.4],
                "image_std": [0.3, 0.3, 0.3],
                "resample": 2,
                "size": {"shortest_edge": 40},
            }
        )
    )
    return root


def test_transformers_js_layout_and_variants(xenova: Path) -> None:
    p = start(xenova)
    spec = p.model_spec
    assert spec is not None
    assert spec.layout == "transformers.js" and spec.image.interpolation == "bilinear"
    from themis_clip.models.spec import ImageSpec
    from themis_clip.preprocess.image import ImagePreprocessor

    pixels = ImagePreprocessor(
        ImageSpec(image_size=40, mean=(0.4,) * 3, std=(0.3,) * 3, interpolation="bilinear")
    )(IMAGE)
    expected = raw(xenova / "onnx" / "vision_model.onnx", {"pixel_values": pixels[None]})
    r = p.generate_embedding(IMAGE)
    assert r.ok and np.abs(r.embedding - expected[0]).max() < 1e-5  # type: ignore[operator]
    assert p.generate_text_embedding(TEXT).ok
    q = start(xenova, variant="quantized")
    assert q.model_spec is not None
    assert q.model_spec.visual_path.name == "vision_model_quantized.onnx"
    assert q.model_spec.textual_path.name == "text_model_quantized.onnx"
    assert not np.allclose(q.generate_embedding(IMAGE).embedding, r.embedding)  # type: ignore[arg-type]
    bad = OnnxClipPlugin()
    assert not bad.initialize(
        PluginConfig.from_dict({"model": {"path": str(xenova), "variant": "fp16"}})
    )
    assert "available: fp32, quantized" in (bad.last_error or "")


def test_clip_as_service_layout(tmp_path: Path, tiny_model_dir: Path) -> None:
    root = tmp_path / "cas"
    size, eot = vocab(tiny_model_dir / "tokenizer.json")
    build_vision_tower(VisionTowerSpec(image_size=224, patch=32), root / "visual.onnx")
    build_text_tower(
        TextTowerSpec(
            vocab_size=size, eot_id=eot, ids_dtype=TensorProto.INT32, mask_name="attention_mask"
        ),
        root / "textual.onnx",
    )
    # clip-as-service ships its tokenizer outside the model folder: image-only unless configured.
    p = start(root)
    assert p.model_spec is not None
    assert p.model_spec.layout == "clip-as-service" and p.get_statistics()["text_tower"] is False
    assert p.generate_embedding(IMAGE).ok
    assert "no text tower" in (p.generate_text_embedding(TEXT).error or "")
    q = start(root, tokenizer_path=str(tiny_model_dir / "tokenizer.json"))
    assert q.get_statistics()["text_tower"] and q.generate_text_embedding(TEXT).ok
    assert q.get_statistics()["image_size"] == 224


def lakera_towers(root: Path, tag: str, tokenizer: Path) -> None:
    """lakera's ``clip_image_model_<tag>.onnx`` and ``clip_text_model_<tag>.onnx``."""
    size, eot = vocab(tokenizer)
    build_vision_tower(
        VisionTowerSpec(input_name="IMAGE", output_name="IMAGE_EMBEDDING"),
        root / f"clip_image_model_{tag}.onnx",
    )
    build_text_tower(
        TextTowerSpec(
            vocab_size=size,
            eot_id=eot,
            input_name="TEXT",
            ids_dtype=TensorProto.INT32,
            output_name="TEXT_EMBEDDING",
        ),
        root / f"clip_text_model_{tag}.onnx",
    )


def test_lakera_layout(tmp_path: Path, tiny_model_dir: Path) -> None:
    root = tmp_path / "lakera"
    lakera_towers(root, "vitb32", tiny_model_dir / "tokenizer.json")
    p = start(root, tokenizer_path=str(tiny_model_dir / "tokenizer.json"))
    assert p.get_statistics()["model_variant"] == "lakera-vitb32"
    r = p.generate_embedding_batch([IMAGE, IMAGE])
    assert all(x.ok for x in r) and np.array_equal(r[0].embedding, r[1].embedding)
    t = p.generate_text_embedding(TEXT)
    assert t.ok and abs(float(np.linalg.norm(t.embedding)) - 1) < 1e-5  # type: ignore[arg-type]


def test_optimum_tower_only_export_is_refused(tmp_path: Path) -> None:
    build_vision_tower(
        VisionTowerSpec(output_name="pooler_output", extra_outputs=False), tmp_path / "model.onnx"
    )
    p = OnnxClipPlugin()
    assert not p.initialize(
        PluginConfig.from_dict({"model": {"path": str(tmp_path / "model.onnx")}})
    )
    assert "without the projection" in (p.last_error or "")


def test_unknown_directory(tmp_path: Path) -> None:
    (tmp_path / "stuff.onnx").write_bytes(b"")
    p = OnnxClipPlugin()
    assert not p.initialize(PluginConfig.from_dict({"model": {"path": str(tmp_path)}}))
    assert "immich" in (p.last_error or "") and "transformers.js" in (p.last_error or "")


def test_unsupported_interpolation_is_a_model_error(immich: Path) -> None:
    cfg_path = immich / "visual" / "preprocess_cfg.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["interpolation"] = "magic"
    cfg_path.write_text(json.dumps(cfg))
    p = OnnxClipPlugin()
    assert not p.initialize(PluginConfig.from_dict({"model": {"path": str(immich)}}))
    assert "unsupported interpolation 'magic'" in (p.last_error or "")


def test_resnet_clip_files_load_by_their_peers_names(tmp_path: Path, tiny_model_dir: Path) -> None:
    """RN50-family ONNX files as lakera (``clip_image_model_rn50.onnx``) and clip-as-service
    (``RN50x4::openai``: ``visual.onnx`` at 288 px) name them: the loader reads names, shapes and
    sizes from the session, whatever the architecture inside."""
    lakera = tmp_path / "lakera-rn50"
    lakera_towers(lakera, "rn50", tiny_model_dir / "tokenizer.json")
    p = start(lakera, tokenizer_path=str(tiny_model_dir / "tokenizer.json"))
    assert p.get_statistics()["model_variant"] == "lakera-rn50"
    assert p.generate_embedding(IMAGE).ok and p.generate_text_embedding(TEXT).ok
    cas = tmp_path / "RN50x4-openai"
    build_vision_tower(VisionTowerSpec(image_size=288), cas / "visual.onnx")
    p = start(cas)
    assert p.get_statistics()["image_size"] == 288
    assert p.generate_embedding(IMAGE).ok


@pytest.mark.parametrize(
    ("layout", "rel"),
    [
        ("immich", "config.json"),
        ("immich", "visual/preprocess_cfg.json"),
        ("immich", "textual/tokenizer_config.json"),
        ("xenova", "config.json"),
        ("xenova", "preprocessor_config.json"),
    ],
)
def test_a_peer_config_file_linked_out_of_the_folder_is_refused(
    request: pytest.FixtureRequest, tmp_path: Path, layout: str, rel: str
) -> None:
    # A config a peer layout reads is as much the model as its towers: a link out of the
    # folder would let another folder's file steer the preprocessing or the tokenizer.
    root: Path = request.getfixturevalue(layout)
    outside = tmp_path / "elsewhere.json"
    shutil.copy(root / rel, outside)
    (root / rel).unlink()
    (root / rel).symlink_to(outside)
    with pytest.raises(ModelFormatError, match=f"{rel} leaves the model folder"):
        resolve_model(root)
    (root / rel).unlink()
    shutil.copy(outside, root / rel)
    resolve_model(root)  # the same bytes inside the folder load
