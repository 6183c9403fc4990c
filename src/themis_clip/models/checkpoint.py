"""A transformers checkpoint folder, checked against its own weights before anything is built.

``config.json`` decides what the exporter allocates; the safetensors header (an 8-byte length,
then JSON: tensor name → dtype, shape, offsets) says what the weights hold. Both are read here
without loading a tensor, and a config that disagrees with its weights (a million layers beside
two, a width no tensor has) or declares a size beyond any CLIP model is refused, so a 1 KB
config cannot make the exporter build a model of gigabytes.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

from themis_clip.errors import ModelFormatError

__all__ = ["MAX_CONFIG_BYTES", "MAX_DIMENSION", "check_checkpoint", "safetensors_shapes"]

#: a checkpoint's ``config.json`` is a few KB; more is not a config
MAX_CONFIG_BYTES = 1024**2
#: the safetensors header of the largest CLIP checkpoints is well under 1 MB
_MAX_HEADER_BYTES = 64 * 1024**2
#: no size a CLIP/SigLIP config declares (widths, vocabulary, positions, layers) comes near this
MAX_DIMENSION = 1 << 20
WEIGHTS = "model.safetensors"
PICKLED = "pytorch_model.bin"
_TOWERS = (("vision_config", "vision_model"), ("text_config", "text_model"))
_WIDTHS = ("hidden_size", "intermediate_size")


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape, from the safetensors header of ``path`` (no tensor is read).

    Raises:
        ModelFormatError: not a safetensors file, or a header out of bounds.
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
            if not 2 <= length <= _MAX_HEADER_BYTES:
                raise ModelFormatError(f"{path}: not a safetensors file (header length {length})")
            data = json.loads(fh.read(length))
    except OSError as exc:
        raise ModelFormatError(f"cannot read {path}: {exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelFormatError(f"{path}: the safetensors header is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path}: the safetensors header is not an object")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, entry in data.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ModelFormatError(f"{path}: tensor {name[:80]!r} has no valid shape")
        shapes[name] = tuple(shape)
    return shapes


def check_checkpoint(folder: Path) -> None:
    """Refuse a checkpoint whose ``config.json`` disagrees with its ``model.safetensors``.

    Each tower's layer count must be the number of layers the weights hold, its widths must be
    dimensions of its tensors, and no declared size may exceed :data:`MAX_DIMENSION`. A folder
    with only a pickled ``pytorch_model.bin`` is refused: unpickling runs the code it holds.

    Raises:
        ModelFormatError: naming the file, the key and both values.
    """
    weights = folder / WEIGHTS
    if not weights.is_file():
        if (folder / PICKLED).is_file():
            raise ModelFormatError(pickled_message(folder.name))
        raise ModelFormatError(f"{folder}: no {WEIGHTS} beside config.json")
    config = _read_config(folder / "config.json")
    _bounded(config, "config.json")
    shapes = safetensors_shapes(weights)
    for section, prefix in _TOWERS:
        sub = config.get(section)
        if not isinstance(sub, dict):
            continue  # transformers' defaults: a base-sized tower, checked when loading weights
        tensors = {n: s for n, s in shapes.items() if n.startswith(prefix + ".")}
        layer = re.compile(rf"^{prefix}\.(?:.+\.)?(?:layers|layer)\.(\d+)\.")
        held = {int(m.group(1)) for n in tensors if (m := layer.match(n))}
        declared = sub.get("num_hidden_layers")
        if declared is not None and declared != len(held):
            raise ModelFormatError(
                f"config.json: {section}.num_hidden_layers is {declared} but {WEIGHTS} holds "
                f"{len(held)} {prefix} layers: the config does not describe these weights"
            )
        dims = {d for shape in tensors.values() for d in shape}
        for key in _WIDTHS:
            value = sub.get(key)
            if value is not None and value not in dims:
                raise ModelFormatError(
                    f"config.json: {section}.{key} is {value} but no {prefix} tensor of "
                    f"{WEIGHTS} has that dimension: the config does not describe these weights"
                )


def pickled_message(name: str) -> str:
    """Why a pickled checkpoint is refused (unpickling it would run the code it holds)."""
    return (
        f"{name} holds only {PICKLED}, a pickled checkpoint: a pickle holds code that loading it "
        f"would run, so it is refused; use a repo that ships {WEIGHTS}, or a ready ONNX model"
    )


def _read_config(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ModelFormatError(f"cannot read {path}: {exc}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ModelFormatError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes: not a config")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ModelFormatError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path}: not a JSON object")
    return data


def _bounded(value: Any, where: str) -> None:
    """Every integer of the config within ``[-MAX_DIMENSION, MAX_DIMENSION]``, token ids too."""
    if isinstance(value, dict):
        for k, v in value.items():
            _bounded(v, f"{where}: {k}" if where.endswith(".json") else f"{where}.{k}")
    elif isinstance(value, list):
        for v in value:
            _bounded(v, where)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_DIMENSION:
        raise ModelFormatError(f"{where} is {value}: above {MAX_DIMENSION}, not a CLIP size")
