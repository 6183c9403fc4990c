from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import SessionRecorder, make_plugin, photo_like
from themis_clip import ModelConfig, OnnxClipPlugin, PluginConfig
from themis_clip.engine import l2_normalize
from themis_clip.export.tiny import (
    TextTowerSpec,
    VisionTowerSpec,
    build_text_tower,
    build_vision_tower,
)
from themis_clip.preprocess.text import CLIPTokenizer

TEXTS = ["a red circle", "a small blue square on the left", "", "x " * 100, "purple star"]


def images(n: int) -> list[np.ndarray]:
    return [photo_like(40 + 7 * i, 30 + 5 * i, i) for i in range(n)]


def text_spec(tok_dir: Path, **kw: object) -> TextTowerSpec:
    tok = CLIPTokenizer(tok_dir / "tokenizer.json")
    vocab = (
        len(__import__("json").loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"])
        + 2
    )
    return TextTowerSpec(vocab_size=vocab, eot_id=tok.eot_id, seed=1, **kw)  # type: ignore[arg-type]


def single_file_plugin(
    tmp_path: Path,
    tok_dir: Path,
    vision: VisionTowerSpec,
    text: TextTowerSpec | None,
    **config: object,
) -> OnnxClipPlugin:
    build_vision_tower(vision, tmp_path / "v.onnx")
    text_path = None
    if text is not None:
        build_text_tower(text, tmp_path / "t.onnx")
        (tmp_path / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
        text_path = str(tmp_path / "t.onnx")
    plugin = OnnxClipPlugin()
    cfg = PluginConfig(
        model=ModelConfig(path=str(tmp_path / "v.onnx"), text_path=text_path), **config
    )  # type: ignore[arg-type]
    assert plugin.initialize(cfg), plugin.last_error
    return plugin


def test_l2_normalize_flags_bad_rows() -> None:
    x = np.array([[3, 4], [0, 0], [np.nan, 1], [np.inf, 0]], dtype=np.float32)
    out, valid = l2_normalize(x)
    assert valid.tolist() == [True, False, False, False]
    assert np.allclose(out[0], [0.6, 0.8]) and not out[1:].any()


def test_fixed_batch_one_graph_is_looped_and_normalised_outputs_are_idempotent(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # immich style: batch fixed at 1, output "embedding" already L2-normalised in the graph.
    fixed = single_file_plugin(
        tmp_path / "a",
        tiny_model_dir,
        VisionTowerSpec(batch=1, normalize=True, output_name="embedding"),
        None,
    )
    dynamic = single_file_plugin(tmp_path / "b", tiny_model_dir, VisionTowerSpec(), None)
    imgs = images(5)
    a = fixed.generate_embedding_batch(imgs)
    b = dynamic.generate_embedding_batch(imgs)
    assert all(r.ok for r in a + b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.embedding is not None and rb.embedding is not None
        assert np.abs(ra.embedding - rb.embedding).max() < 1e-5
        assert abs(float(np.linalg.norm(ra.embedding)) - 1) < 1e-5
    assert fixed.get_statistics()["batches"] == 5  # looped one by one
    assert dynamic.get_statistics()["batches"] == 1


def test_batches_split_at_max_batch_size(plugin: OnnxClipPlugin, tiny_model_dir: Path) -> None:
    small = make_plugin(tiny_model_dir, max_batch_size=3)
    results = small.generate_embedding_batch(images(8))
    assert all(r.ok for r in results)
    stats = small.get_statistics()
    assert stats["batches"] == 3 and stats["mean_batch_size"] == pytest.approx(8 / 3)
    reference = plugin.generate_embedding_batch(images(8))
    for r, ref in zip(results, reference, strict=True):
        assert np.abs(r.embedding - ref.embedding).max() < 1e-5  # type: ignore[operator]
    small.shutdown()


def test_trimmed_text_batches_equal_full_padding(
    plugin: OnnxClipPlugin, tmp_path: Path, tiny_model_dir: Path
) -> None:
    # Same weights, one graph with a fixed 77-token axis (always full padding), one dynamic.
    fixed = single_file_plugin(
        tmp_path / "f", tiny_model_dir, VisionTowerSpec(), text_spec(tiny_model_dir, seq=77)
    )
    dynamic = single_file_plugin(
        tmp_path / "d", tiny_model_dir, VisionTowerSpec(), text_spec(tiny_model_dir)
    )
    a = fixed.generate_text_embedding_batch(TEXTS)
    b = dynamic.generate_text_embedding_batch(TEXTS)
    for ra, rb in zip(a, b, strict=True):
        assert ra.ok and rb.ok
        assert np.abs(ra.embedding - rb.embedding).max() < 1e-6  # type: ignore[operator]
    # The dynamic model really ran trimmed: its session never saw 77 columns for short texts.
    assert dynamic.get_statistics()["text_input"]["fixed_length"] is None
    assert fixed.get_statistics()["text_input"]["fixed_length"] == 77


def test_length_sorted_batches_restore_order(tiny_model_dir: Path) -> None:
    one = make_plugin(tiny_model_dir, max_batch_size=2)
    batched = one.generate_text_embedding_batch(TEXTS)
    singles = [one.generate_text_embedding(t) for t in TEXTS]
    for b, s in zip(batched, singles, strict=True):
        assert np.abs(b.embedding - s.embedding).max() < 1e-5  # type: ignore[operator]
    assert [r.truncated for r in batched] == [False, False, False, True, False]
    assert len({r.embedding.tobytes() for r in batched}) == 5  # type: ignore[union-attr]
    one.shutdown()


def test_int32_ids_with_attention_mask(tmp_path: Path, tiny_model_dir: Path) -> None:
    # clip-as-service style: input_ids + attention_mask, both int32.
    p = single_file_plugin(
        tmp_path,
        tiny_model_dir,
        VisionTowerSpec(),
        text_spec(tiny_model_dir, ids_dtype=TensorProto.INT32, mask_name="attention_mask"),
    )
    ref = single_file_plugin(
        tmp_path / "r", tiny_model_dir, VisionTowerSpec(), text_spec(tiny_model_dir)
    )
    for a, b in zip(
        p.generate_text_embedding_batch(TEXTS),
        ref.generate_text_embedding_batch(TEXTS),
        strict=True,
    ):
        assert a.ok and np.abs(a.embedding - b.embedding).max() < 1e-6  # type: ignore[operator]


def test_declared_dimension_mismatch_fails_initialize(tiny_model_dir: Path) -> None:
    plugin = OnnxClipPlugin()
    cfg = PluginConfig(model=ModelConfig(path=str(tiny_model_dir), embedding_dim=512))
    assert not plugin.initialize(cfg)
    assert "model.embedding_dim is 512 but the model outputs 32" in (plugin.last_error or "")


def test_dynamic_output_dimension_is_probed(tmp_path: Path) -> None:
    build_vision_tower(VisionTowerSpec(dim=24), tmp_path / "v.onnx")
    model = onnx.load(str(tmp_path / "v.onnx"))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "dim"
    onnx.save(model, str(tmp_path / "v.onnx"))
    plugin = make_plugin(tmp_path / "v.onnx")
    assert plugin.get_statistics()["embedding_dim"] == 24
    assert plugin.generate_embedding(images(1)[0]).embedding.shape == (24,)  # type: ignore[union-attr]


@pytest.mark.parametrize("fault", ["wide", "nan"])
def test_health_check_verifies_shape_and_finiteness(tiny_model_dir: Path, fault: str) -> None:
    sessions = SessionRecorder()
    plugin = make_plugin(tiny_model_dir, session_factory=sessions)
    assert plugin.health_check() is True
    session = sessions.last("visual")
    real_run = session.run

    def faulty_run(names, feeds):  # type: ignore[no-untyped-def]
        (out,) = real_run(names, feeds)
        if fault == "wide":
            return [np.concatenate([out, out[:, :1]], axis=1)]
        return [np.full_like(out, np.nan)]

    session.run = faulty_run  # type: ignore[method-assign]
    assert plugin.health_check() is False
    assert plugin.get_statistics()["last_health_check"] is False
    result = plugin.generate_embedding(images(1)[0])
    assert not result.ok and result.error_type == "InferenceError"
    plugin.shutdown()


def rank3_tower(path: Path) -> None:
    w = numpy_helper.from_array(np.ones((8, 3, 8, 8), np.float32), "w")
    shape = numpy_helper.from_array(np.array([0, 8, -1], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["pixel_values", "w"], ["c"], strides=[8, 8]),
            helper.make_node("Reshape", ["c", "shape"], ["r"]),
            helper.make_node("Transpose", ["r"], ["last_hidden_state"], perm=[0, 2, 1]),
        ],
        "g",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", 16, 8])],
        [w, shape],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_tower_without_projection_is_refused(tmp_path: Path) -> None:
    rank3_tower(tmp_path / "v.onnx")
    plugin = OnnxClipPlugin()
    assert not plugin.initialize(PluginConfig(model=ModelConfig(path=str(tmp_path / "v.onnx"))))
    assert "without the projection" in (plugin.last_error or "")


def test_joint_model_is_refused(tmp_path: Path) -> None:
    build_vision_tower(VisionTowerSpec(), tmp_path / "v.onnx")
    model = onnx.load(str(tmp_path / "v.onnx"))
    model.graph.input.append(
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    )
    onnx.save(model, str(tmp_path / "v.onnx"))
    plugin = OnnxClipPlugin()
    assert not plugin.initialize(PluginConfig(model=ModelConfig(path=str(tmp_path / "v.onnx"))))
    assert "must take one float tensor" in (plugin.last_error or "")


def test_image_size_follows_a_fixed_graph_and_conflicts_are_errors(tmp_path: Path) -> None:
    build_vision_tower(VisionTowerSpec(image_size=48, patch=8), tmp_path / "v.onnx")
    plugin = make_plugin(tmp_path / "v.onnx")
    assert plugin.get_statistics()["image_size"] == 48
    bad = OnnxClipPlugin()
    cfg = PluginConfig.from_dict(
        {"model": {"path": str(tmp_path / "v.onnx")}, "preprocess": {"image_size": 64}}
    )
    assert not bad.initialize(cfg)
    assert "does not match the image tower's fixed input 48x48" in (bad.last_error or "")


def test_fp16_input_graph(tmp_path: Path) -> None:
    p16 = single_file_plugin(
        tmp_path / "h", tmp_path, VisionTowerSpec(input_dtype=TensorProto.FLOAT16), None
    )
    p32 = single_file_plugin(tmp_path / "f", tmp_path, VisionTowerSpec(), None)
    a = p16.generate_embedding(images(1)[0])
    b = p32.generate_embedding(images(1)[0])
    assert a.ok and float(a.embedding @ b.embedding) > 0.999  # type: ignore[operator]
