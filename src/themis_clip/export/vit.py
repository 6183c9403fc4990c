"""CLIP-architecture image towers with random weights, built with the ``onnx`` helper API.

A pre-LayerNorm Vision Transformer exactly in CLIP's shape (patch conv without bias, class
token, positional embedding, ``ln_pre``, residual attention + QuickGELU MLP blocks, ``ln_post``
on the class token, projection). Used for memory and speed benchmarks where the real
architecture and size matter but trained weights do not; no torch needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["VIT_B_32", "VIT_L_14", "ViTSpec", "build_vit_visual"]


@dataclass(frozen=True, kw_only=True)
class ViTSpec:
    image_size: int = 224
    patch: int = 32
    width: int = 768
    layers: int = 12
    heads: int = 12
    dim: int = 512
    seed: int = 0


VIT_B_32 = ViTSpec()
VIT_L_14 = ViTSpec(patch=14, width=1024, layers=24, heads=16, dim=768)


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

    def weight(self, stem: str, shape: tuple[int, ...], scale: float) -> str:
        name = self.name(stem)
        data = (self.rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(data, name))
        return name

    def const(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], stem: str | None = None, **attrs: Any) -> str:
        out = self.name(stem or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def layer_norm(self, x: str, width: int) -> str:
        scale = self.const("ln_w", np.ones(width, np.float32))
        bias = self.const("ln_b", np.zeros(width, np.float32))
        return self.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)

    def linear(self, x: str, fan_in: int, fan_out: int) -> str:
        w = self.weight("w", (fan_in, fan_out), fan_in**-0.5)
        b = self.const("b", np.zeros(fan_out, np.float32))
        return self.op("Add", [self.op("MatMul", [x, w]), b])


def build_vit_visual(
    spec: ViTSpec, path: Path | None = None, *, output_name: str = "image_embeds"
) -> onnx.ModelProto:
    """Build (and save, if ``path``) a CLIP ViT image tower ``[N,3,S,S] → [N, dim]``."""
    b = _Builder(spec.seed)
    w, h = spec.width, spec.heads
    grid = spec.image_size // spec.patch
    tokens = grid * grid + 1
    conv_w = b.weight("patch_w", (w, 3, spec.patch, spec.patch), (3 * spec.patch**2) ** -0.5)
    x = b.op(
        "Conv", ["pixel_values", conv_w], kernel_shape=[spec.patch] * 2, strides=[spec.patch] * 2
    )
    x = b.op("Reshape", [x, b.const("shape", np.array([0, w, -1], np.int64))])
    x = b.op("Transpose", [x], perm=[0, 2, 1])  # [N, grid², W]
    cls = b.weight("class_embedding", (1, 1, w), w**-0.5)
    batch = b.op(
        "Slice",
        [
            b.op("Shape", [x]),
            b.const("s0", np.array([0], np.int64)),
            b.const("s1", np.array([1], np.int64)),
        ],
    )
    cls_shape = b.op("Concat", [batch, b.const("one_w", np.array([1, w], np.int64))], axis=0)
    x = b.op("Concat", [b.op("Expand", [cls, cls_shape]), x], axis=1)
    x = b.op("Add", [x, b.weight("positional_embedding", (tokens, w), w**-0.5)])
    x = b.layer_norm(x, w)
    head_shape = b.const("heads", np.array([0, tokens, h, w // h], np.int64))
    merge_shape = b.const("merge", np.array([0, tokens, w], np.int64))
    scale = b.const("scale", np.array((w // h) ** -0.5, np.float32))
    gelu_k = b.const("gelu", np.array(1.702, np.float32))
    for _ in range(spec.layers):
        y = b.layer_norm(x, w)
        qkv = b.linear(y, w, 3 * w)
        q, k, v = (b.name(s) for s in ("q", "k", "v"))
        b.nodes.append(
            helper.make_node(
                "Split", [qkv, b.const("split", np.array([w, w, w], np.int64))], [q, k, v], axis=-1
            )
        )
        q, k, v = (
            b.op("Transpose", [b.op("Reshape", [t, head_shape])], perm=[0, 2, 1, 3])
            for t in (q, k, v)
        )
        att = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
        y = b.op("MatMul", [b.op("Softmax", [att], axis=-1), v])
        y = b.op("Reshape", [b.op("Transpose", [y], perm=[0, 2, 1, 3]), merge_shape])
        x = b.op("Add", [x, b.linear(y, w, w)])
        y = b.linear(b.layer_norm(x, w), w, 4 * w)
        y = b.op("Mul", [y, b.op("Sigmoid", [b.op("Mul", [y, gelu_k])])])  # QuickGELU
        x = b.op("Add", [x, b.linear(y, 4 * w, w)])
    cls_out = b.op("Gather", [x, b.const("zero", np.array(0, np.int64))], axis=1)
    pooled = b.layer_norm(cls_out, w)
    proj = b.weight("proj", (w, spec.dim), w**-0.5)
    b.nodes.append(helper.make_node("MatMul", [pooled, proj], [output_name]))
    graph = helper.make_graph(
        b.nodes,
        "clip_vit_visual",
        [
            helper.make_tensor_value_info(
                "pixel_values", TensorProto.FLOAT, ["batch", 3, spec.image_size, spec.image_size]
            )
        ],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", spec.dim])],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
    return model
