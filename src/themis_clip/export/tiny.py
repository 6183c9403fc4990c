"""Tiny CLIP-shaped ONNX towers built with the ``onnx`` helper API (tests and layout fixtures).

* Image tower: patch-embedding Conv (kernel = stride = patch) → tanh → spatial mean →
  projection. Input ``[N, 3, S, S]`` float32, output ``[N, D]``.
* Text tower: embedding table → causal prefix sum → mean at the first EOT position → tanh →
  projection. Like CLIP's tower it pools at EOT under a causal mask, so padding after EOT
  cannot change the embedding. Input ids ``[N, L]`` int32/int64 (+ optional attention mask).

Names, dtypes, fixed or dynamic axes and in-graph normalisation are parameters, so the tests
can build every layout that peers ship (REFERENCE.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from themis_clip.errors import ExportError

__all__ = ["TextTowerSpec", "VisionTowerSpec", "build_text_tower", "build_vision_tower"]

_OPSET = 17


@dataclass(frozen=True, kw_only=True)
class VisionTowerSpec:
    image_size: int = 32
    patch: int = 8
    width: int = 16
    dim: int = 32
    seed: int = 0
    input_name: str = "pixel_values"
    output_name: str = "image_embeds"
    batch: int | str = "batch"  # an int fixes the batch axis
    normalize: bool = False
    input_dtype: int = TensorProto.FLOAT
    extra_outputs: bool = False


@dataclass(frozen=True, kw_only=True)
class TextTowerSpec:
    vocab_size: int
    eot_id: int
    width: int = 16
    dim: int = 32
    seed: int = 1
    input_name: str = "input_ids"
    ids_dtype: int = TensorProto.INT64
    mask_name: str | None = None
    output_name: str = "text_embeds"
    batch: int | str = "batch"
    seq: int | str = "sequence"  # an int fixes the sequence axis
    normalize: bool = False


def _normalize_nodes(src: str, dst: str) -> list[Any]:
    return [
        helper.make_node("ReduceL2", [src], [f"{dst}_norm"], axes=[1], keepdims=1),
        helper.make_node("Div", [src, f"{dst}_norm"], [dst]),
    ]


def build_vision_tower(spec: VisionTowerSpec, path: Path | None = None) -> onnx.ModelProto:
    """Build (and save, if ``path``) a tiny image tower."""
    rng = np.random.default_rng(spec.seed)
    conv_w = rng.normal(0, 0.5, (spec.width, 3, spec.patch, spec.patch)).astype(np.float32)
    conv_b = rng.normal(0, 0.1, (spec.width,)).astype(np.float32)
    proj = rng.normal(0, 1.0, (spec.width, spec.dim)).astype(np.float32)
    inits = [
        numpy_helper.from_array(conv_w, "patch_w"),
        numpy_helper.from_array(conv_b, "patch_b"),
        numpy_helper.from_array(proj, "proj"),
    ]
    x = spec.input_name
    nodes = []
    if spec.input_dtype != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [x], ["x32"], to=TensorProto.FLOAT))
        x = "x32"
    nodes += [
        helper.make_node(
            "Conv",
            [x, "patch_w", "patch_b"],
            ["patches"],
            kernel_shape=[spec.patch] * 2,
            strides=[spec.patch] * 2,
        ),
        helper.make_node("Tanh", ["patches"], ["act"]),
        helper.make_node("ReduceMean", ["act"], ["pooled"], axes=[2, 3], keepdims=0),
        helper.make_node(
            "MatMul", ["pooled", "proj"], ["raw" if spec.normalize else spec.output_name]
        ),
    ]
    if spec.normalize:
        nodes += _normalize_nodes("raw", spec.output_name)
    outputs = [
        helper.make_tensor_value_info(spec.output_name, TensorProto.FLOAT, [spec.batch, spec.dim])
    ]
    if spec.extra_outputs:
        outputs.append(
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [spec.batch, spec.width])
        )
    graph = helper.make_graph(
        nodes,
        "tiny_visual",
        [
            helper.make_tensor_value_info(
                spec.input_name, spec.input_dtype, [spec.batch, 3, spec.image_size, spec.image_size]
            )
        ],
        outputs,
        inits,
    )
    return _finish(graph, path)


def build_text_tower(spec: TextTowerSpec, path: Path | None = None) -> onnx.ModelProto:
    """Build (and save, if ``path``) a tiny text tower."""
    rng = np.random.default_rng(spec.seed)
    table = rng.normal(0, 1.0, (spec.vocab_size, spec.width)).astype(np.float32)
    proj = rng.normal(0, 1.0, (spec.width, spec.dim)).astype(np.float32)
    inits = [
        numpy_helper.from_array(table, "token_table"),
        numpy_helper.from_array(proj, "proj"),
        numpy_helper.from_array(np.array(spec.eot_id, dtype=np.int64), "eot"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one_axis"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axes1"),
        numpy_helper.from_array(np.array([1, 1, spec.width], dtype=np.int64), "expand_tail"),
    ]
    nodes = [
        helper.make_node("Cast", [spec.input_name], ["ids64"], to=TensorProto.INT64),
        helper.make_node("Gather", ["token_table", "ids64"], ["tokens"]),
    ]
    inputs = [
        helper.make_tensor_value_info(spec.input_name, spec.ids_dtype, [spec.batch, spec.seq])
    ]
    emb = "tokens"
    if spec.mask_name:
        inputs.append(
            helper.make_tensor_value_info(spec.mask_name, spec.ids_dtype, [spec.batch, spec.seq])
        )
        nodes += [
            helper.make_node("Cast", [spec.mask_name], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["maskf", "minus1"], ["mask3"]),
            helper.make_node("Mul", ["tokens", "mask3"], ["masked"]),
        ]
        inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus1"))
        emb = "masked"
    nodes += [
        helper.make_node("CumSum", [emb, "one_axis"], ["prefix"]),
        helper.make_node("Equal", ["ids64", "eot"], ["is_eot"]),
        helper.make_node("Cast", ["is_eot"], ["is_eot_f"], to=TensorProto.FLOAT),
        helper.make_node("ArgMax", ["is_eot_f"], ["eot_pos"], axis=1, keepdims=1),  # first EOT
        helper.make_node("Unsqueeze", ["eot_pos", "axes1"], ["eot_pos3"]),
        helper.make_node("Shape", ["prefix"], ["prefix_shape"]),
        helper.make_node("Slice", ["prefix_shape", "zero1", "one1"], ["batch_dim"]),
        helper.make_node("Concat", ["batch_dim", "one1", "width1"], ["gather_shape"], axis=0),
        helper.make_node("Expand", ["eot_pos3", "gather_shape"], ["gather_idx"]),
        helper.make_node("GatherElements", ["prefix", "gather_idx"], ["at_eot3"], axis=1),
        helper.make_node("Squeeze", ["at_eot3", "axes1"], ["at_eot"]),
        helper.make_node("Cast", ["eot_pos"], ["eot_pos_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["eot_pos_f", "onef"], ["count"]),
        helper.make_node("Div", ["at_eot", "count"], ["mean"]),
        helper.make_node("Tanh", ["mean"], ["act"]),
        helper.make_node(
            "MatMul", ["act", "proj"], ["raw" if spec.normalize else spec.output_name]
        ),
    ]
    inits += [
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero1"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one1"),
        numpy_helper.from_array(np.array([spec.width], dtype=np.int64), "width1"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "onef"),
    ]
    inits = [i for i in inits if i.name != "expand_tail"]
    if spec.normalize:
        nodes += _normalize_nodes("raw", spec.output_name)
    graph = helper.make_graph(
        nodes,
        "tiny_textual",
        inputs,
        [
            helper.make_tensor_value_info(
                spec.output_name, TensorProto.FLOAT, [spec.batch, spec.dim]
            )
        ],
        inits,
    )
    return _finish(graph, path)


def _finish(graph: Any, path: Path | None) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
    return model


def build_model_dir(
    root: Path,
    *,
    name: str = "tiny-clip",
    image_size: int = 32,
    patch: int = 8,
    width: int = 16,
    dim: int = 32,
    seed: int = 0,
    context_length: int = 77,
    pad_id: int = 0,
    resize_mode: str = "shortest",
) -> Path:
    """Write a complete model directory in this project's layout (towers, tokenizer, manifest)."""
    from themis_clip.export.tokenizer import build_clip_tokenizer
    from themis_clip.models.layout import write_manifest
    from themis_clip.vocabulary import CLIP_MEAN, CLIP_STD

    root.mkdir(parents=True, exist_ok=True)
    tok = build_clip_tokenizer(root / "tokenizer.json")
    eot = tok.token_to_id("<|endoftext|>")
    if eot is None:
        raise ExportError("tokenizer lacks <|endoftext|>")
    build_vision_tower(
        VisionTowerSpec(image_size=image_size, patch=patch, width=width, dim=dim, seed=seed),
        root / "visual.onnx",
    )
    build_text_tower(
        TextTowerSpec(
            vocab_size=tok.get_vocab_size(), eot_id=int(eot), width=width, dim=dim, seed=seed + 1
        ),
        root / "textual.onnx",
    )
    write_manifest(
        root,
        name=name,
        embedding_dim=dim,
        visual={
            "file": "visual.onnx",
            "image_size": image_size,
            "mean": list(CLIP_MEAN),
            "std": list(CLIP_STD),
            "resize_mode": resize_mode,
        },
        textual={
            "file": "textual.onnx",
            "tokenizer": "tokenizer.json",
            "context_length": context_length,
            "pad_id": pad_id,
        },
    )
    return root
