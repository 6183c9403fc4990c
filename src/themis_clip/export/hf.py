"""Export a Hugging Face ``transformers`` CLIP checkpoint into this project's model directory.

Input: a local ``CLIPModel.save_pretrained`` folder (``config.json``, weights, tokenizer files,
``preprocessor_config.json``). Output::

    visual.onnx     pixel_values [N,3,S,S] float32 → image_embeds [N,D] (with the projection)
    textual.onnx    input_ids [N,L] int64 → text_embeds [N,D]; N and L dynamic
    tokenizer.json  the checkpoint's fast tokenizer
    manifest.json   embedding dim, image size, mean/std, resize mode, interpolation,
                    context length, pad id, variants, SHA-256 of every file

``precisions`` adds ``fp16`` (weights and compute in half precision, inputs/outputs kept float32:
for GPUs), ``int8`` (static quantisation calibrated once: batch-independent, for CPUs; see
:mod:`themis_clip.export.quantize`) and ``int8-dynamic`` (ONNX Runtime's dynamic quantisation,
batch-dependent, kept as an explicit choice) as manifest variants.
Towers whose weights exceed ``external_data_threshold_bytes`` (2 GB by default, the protobuf
limit) store them in ``<file>.data`` beside the graph.

Needs the ``[export]`` extra (torch, transformers, onnx, onnxscript); the core never imports it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

import themis_clip.jsonio as jsonio
from themis_clip.errors import ExportError
from themis_clip.export.wrappers import MaskedTextual, Textual, visual_module
from themis_clip.models.families import FAMILIES as MODEL_FAMILIES
from themis_clip.models.families import Family, VisualInput
from themis_clip.models.layout import write_manifest
from themis_clip.models.peers import HF_RESAMPLE
from themis_clip.preprocess.text import pad_id_from_config
from themis_clip.vocabulary import CLIP_MEAN, CLIP_STD, Padding, Precision, member_of

__all__ = [
    "FAMILIES",
    "PRECISIONS",
    "ExportReport",
    "create_random_checkpoint",
    "export_hf_checkpoint",
    "family_of",
    "load_reference",
    "reference_features",
]

log = logging.getLogger(__name__)

PRECISIONS = tuple(p.value for p in Precision)
TWO_GB = 2 * 1024**3
_OPSET = 18


@dataclass(frozen=True, kw_only=True)
class ExportReport:
    out_dir: Path
    name: str
    embedding_dim: int
    image_size: int
    files: dict[str, int] = field(default_factory=dict)  # file → bytes
    seconds: dict[str, float] = field(default_factory=dict)  # step → seconds


#: the exporter's view of the family table (:mod:`themis_clip.models.families`), by model_type
FAMILIES = MODEL_FAMILIES


def family_of(checkpoint: Path) -> str:
    """The checkpoint's family (``config.json`` ``model_type``), refused if not exportable."""
    path = checkpoint / "config.json"
    try:
        kind = jsonio.read(path).get("model_type")
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path}: cannot read the checkpoint's config ({exc})") from exc
    if kind not in FAMILIES:
        raise ExportError(
            f"{path}: model_type {kind!r} cannot be exported; supported: {', '.join(FAMILIES)}"
        )
    return str(kind)


def reference_features(
    model: Any,
    family: str,
    pixels: torch.Tensor,
    rows: Sequence[Sequence[int]],
    *,
    pad_id: int,
    context_length: int,
) -> tuple[Any, Any]:
    """PyTorch's image and text features (not normalised) for our preprocessed ``pixels`` and
    token ``rows``, fed the way the family was trained: SigLIP padded to the full context,
    BERT/XLM-R towers with their attention mask, SigLIP 2 cut into patches."""
    fam = FAMILIES[family]
    image = visual_module(model, fam)(pixels)
    texts = []
    for row in rows:
        ids = list(row)
        if fam.text.padding is Padding.MAX_LENGTH:
            ids += [pad_id] * (context_length - len(ids))
        tensor = torch.tensor([ids])
        if fam.text.attention_mask:
            texts.append(MaskedTextual(model)(tensor, torch.ones_like(tensor)))
        else:
            texts.append(Textual(model)(tensor))
    return image, torch.cat(texts)


def load_reference(checkpoint: Path) -> Any:
    """The checkpoint as its PyTorch model in eval mode (the parity reference):
    ``CLIPModel`` or ``SiglipModel``, by ``config.json``'s ``model_type``."""
    import transformers

    cls = getattr(transformers, FAMILIES[family_of(checkpoint)].hf_class)
    return cls.from_pretrained(str(checkpoint), local_files_only=True).eval()


def export_hf_checkpoint(
    checkpoint: Path,
    out_dir: Path,
    *,
    precisions: Sequence[str] = ("fp32",),
    name: str | None = None,
    external_data_threshold_bytes: int = TWO_GB,
    extra_manifest: dict[str, Any] | None = None,
    calibration: Path | None = None,
) -> ExportReport:
    """Export ``checkpoint`` into ``out_dir`` (created; must not hold another model).

    ``int8`` is batch-independent static quantisation calibrated on the images in
    ``calibration`` (or a built-in synthetic set, with a warning); ``int8-dynamic`` is ONNX
    Runtime's dynamic quantisation, whose outputs depend on the batch.
    """
    chosen = [member_of(Precision, p) for p in precisions]
    if None in chosen or Precision.FP32 not in chosen:
        raise ExportError(
            f"precisions must include fp32 and be among {PRECISIONS}; got {list(precisions)}"
        )
    wanted = [p for p in chosen if p is not None]
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    family = family_of(checkpoint)
    fam = FAMILIES[family]
    model = load_reference(checkpoint)
    cfg = model.config
    out_dir.mkdir(parents=True, exist_ok=True)
    tok_file, pad_id = _tokenizer(checkpoint, out_dir)
    if fam.visual is VisualInput.PATCHES:  # fixed resolution: the patch budget as a square
        patch = int(cfg.vision_config.patch_size)
        side = round(int(cfg.vision_config.num_patches) ** 0.5) * patch
        pre = _preprocessing(checkpoint, side) | {"image_size": side, "resize_mode": "squash"}
    else:
        pre = _preprocessing(checkpoint, cfg.vision_config.image_size)
    visual = visual_module(model, fam)
    timings["load_s"] = time.perf_counter() - t0
    size = pre["image_size"]
    ctx = _context_length(checkpoint, cfg, fam)
    masked = bool(fam.text.attention_mask)
    with torch.no_grad(), warnings.catch_warnings(), _exportable(fam):
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        _export(
            visual,
            (torch.zeros(2, 3, size, size),),
            ["pixel_values"],
            "image_embeds",
            {"pixel_values": {0: torch.export.Dim("batch")}},
            out_dir / "visual.onnx",
            external_data_threshold_bytes,
        )
        timings["visual_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = torch.full((2, 7), int(cfg.text_config.eos_token_id or 1), dtype=torch.int64)
        batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", min=2, max=ctx)
        axes = {0: batch, 1: sequence}
        if masked:
            _export(
                MaskedTextual(model),
                (ids, torch.ones_like(ids)),
                ["input_ids", "attention_mask"],
                "text_embeds",
                {"input_ids": axes, "attention_mask": axes},
                out_dir / "textual.onnx",
                external_data_threshold_bytes,
            )
        else:
            _export(
                Textual(model),
                (ids,),
                ["input_ids"],
                "text_embeds",
                {"input_ids": axes},
                out_dir / "textual.onnx",
                external_data_threshold_bytes,
            )
        timings["textual_s"] = time.perf_counter() - t0
    variants: dict[str, dict[str, str]] = {}
    for precision in wanted:
        if precision in (Precision.FP32, Precision.INT8):  # int8: calibrated on fp32, below
            continue
        t0 = time.perf_counter()
        variants[precision] = {}
        for tower in ("visual", "textual"):
            target = out_dir / f"{tower}.{precision}.onnx"
            _convert(out_dir / f"{tower}.onnx", target, precision, external_data_threshold_bytes)
            variants[precision][tower] = target.name
        timings[f"{precision}_s"] = time.perf_counter() - t0
    with torch.no_grad():  # the image tower's output width (CLIP's projection_dim, SigLIP's hidden)
        dim = int(visual(torch.zeros(1, 3, size, size)).shape[-1])
    model_name = name or checkpoint.name
    write_manifest(
        out_dir,
        name=model_name,
        embedding_dim=dim,
        visual={k: v for k, v in pre.items() if k != "image_size"}
        | {"file": "visual.onnx", "image_size": size},
        textual={
            "file": "textual.onnx",
            "tokenizer": tok_file.name,
            "context_length": ctx,
            "pad_id": pad_id,
            **fam.manifest_text,
        },
        variants=variants,
        extra={
            "source": {"kind": "transformers", "family": family, "checkpoint": checkpoint.name},
            "scoring": {
                "logit_scale": float(model.logit_scale.exp()),
                "logit_bias": float(model.logit_bias) if hasattr(model, "logit_bias") else None,
            },
            **(extra_manifest or {}),
        },
    )
    if Precision.INT8 in wanted:
        from themis_clip.export.quantize import add_int8_variant

        t0 = time.perf_counter()
        calibrated_on = add_int8_variant(out_dir, calibration=calibration)
        timings["int8_s"] = time.perf_counter() - t0
        log.info("int8 calibrated on %s", calibrated_on)
    files = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()}
    return ExportReport(
        out_dir=out_dir,
        name=model_name,
        embedding_dim=dim,
        image_size=size,
        files=files,
        seconds=timings,
    )


def _export(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_name: str,
    dynamic_shapes: dict[str, Any],
    target: Path,
    threshold: int,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.onnx"
        torch.onnx.export(
            module,
            args,
            str(raw),
            input_names=input_names,
            output_names=[output_name],
            dynamic_shapes=dynamic_shapes,
            opset_version=_OPSET,
            dynamo=True,
            verbose=False,
        )
        _save(onnx.load(str(raw)), target, threshold)


def _save(model: onnx.ModelProto, target: Path, threshold: int) -> None:
    """Save ``model``, moving its weights to ``<target>.data`` above ``threshold`` bytes."""
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    for stale in (target, target.with_name(target.name + ".data")):
        stale.unlink(missing_ok=True)
    if weights > threshold:
        onnx.save_model(
            model,
            str(target),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=target.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(target))


def _convert(source: Path, target: Path, precision: Precision, threshold: int) -> None:
    from themis_clip.export.precision import quantize_int8_dynamic, to_float16

    if precision is Precision.FP16:
        _save(to_float16(onnx.load(str(source))), target, threshold)
    elif precision is Precision.INT8_DYNAMIC:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "q.onnx"
            quantize_int8_dynamic(source, out)
            _save(onnx.load(str(out)), target, threshold)


@contextlib.contextmanager
def _exportable(fam: Family) -> Iterator[None]:
    """SigLIP 2's runtime shape checks (``torch_compilable_check``, an all-true reduction that
    ONNX has no operator for) are off while exporting: at a fixed resolution they always hold."""
    if fam.visual is not VisualInput.PATCHES:
        yield
        return
    from transformers.models.siglip2 import modeling_siglip2

    name = "torch_compilable_check"
    saved = getattr(modeling_siglip2, name)
    setattr(modeling_siglip2, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        setattr(modeling_siglip2, name, saved)


def _context_length(checkpoint: Path, cfg: Any, fam: Family) -> int:
    """The text context: CLIP's and SigLIP's position table; for BERT/XLM-R towers (512
    positions) the tokenizer's ``model_max_length`` (Chinese-CLIP: 52), within the table."""
    positions = int(cfg.text_config.max_position_embeddings) - fam.position_offset
    if not fam.context_from_tokenizer:
        return positions
    path = checkpoint / "tokenizer_config.json"
    declared = _read_json(path).get("model_max_length") if path.is_file() else None
    if isinstance(declared, int) and 2 <= declared <= positions:
        return declared
    return positions


def _tokenizer(checkpoint: Path, out_dir: Path) -> tuple[Path, int]:
    target = out_dir / "tokenizer.json"
    if (checkpoint / "tokenizer.json").is_file():
        shutil.copy(checkpoint / "tokenizer.json", target)
    else:  # only vocab.json + merges.txt: let transformers build the fast tokenizer file
        from transformers import AutoTokenizer

        with tempfile.TemporaryDirectory() as tmp:
            AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True).save_pretrained(
                tmp
            )
            shutil.copy(Path(tmp) / "tokenizer.json", target)
    from themis_clip.export.tokenizer import read_tokenizer

    tok = read_tokenizer(target)
    return target, pad_id_from_config(checkpoint / "tokenizer_config.json", tok)


def _read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON side file, strict; ExportError naming it when unreadable."""
    try:
        data = jsonio.read(path)
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path}: cannot read ({exc})") from exc
    if not isinstance(data, dict):
        raise ExportError(f"{path}: must hold a JSON object")
    return data


def _preprocessing(checkpoint: Path, default_size: int) -> dict[str, Any]:
    path = checkpoint / "preprocessor_config.json"
    pre = _read_json(path) if path.is_file() else {}
    size: Any = pre.get("size")
    # A processor that resizes to height x width and never crops squashes (SigLIP, Chinese-CLIP
    # as OFA-Sys ships it); CLIP resizes the shortest edge, then centre-crops.
    squash_size = isinstance(size, dict) and "height" in size
    do_crop = bool(pre.get("do_center_crop", "crop_size" in pre or not squash_size))
    if do_crop:
        side: Any = pre.get("crop_size", default_size)
    elif isinstance(size, dict):
        side = size.get("height") or size.get("shortest_edge") or default_size
    else:
        side = size or default_size
    if isinstance(side, dict):
        side = side.get("height", default_size)
    crop = int(side)
    return {
        "image_size": int(crop),
        "mean": list(pre.get("image_mean", CLIP_MEAN)),
        "std": list(pre.get("image_std", CLIP_STD)),
        "resize_mode": "shortest" if do_crop else "squash",
        "interpolation": HF_RESAMPLE.get(pre.get("resample", 3), "bicubic"),
    }


def save_image_processor(out_dir: Path, image_size: int) -> None:
    """Write CLIP's ``preprocessor_config.json`` (shortest-side resize, centre crop, mean/std)."""
    from transformers import CLIPImageProcessor

    CLIPImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        image_mean=list(CLIP_MEAN),
        image_std=list(CLIP_STD),
    ).save_pretrained(str(out_dir))


def create_random_checkpoint(
    out_dir: Path,
    tokenizer_json: Path,
    *,
    image_size: int = 32,
    patch: int = 8,
    vision_width: int = 64,
    vision_layers: int = 2,
    vision_heads: int = 4,
    text_width: int = 64,
    text_layers: int = 2,
    text_heads: int = 4,
    projection_dim: int = 32,
    context_length: int = 77,
    vocab_size: int | None = None,
    seed: int = 0,
) -> Path:
    """Save a random-weight ``CLIPModel`` with tokenizer and processor files (tests, benchmarks).

    The architecture is CLIP's (quick_gelu, pre-LN); pass ViT-B/32 sizes for a benchmark model.
    """
    from transformers import CLIPConfig, CLIPModel, PreTrainedTokenizerFast

    from themis_clip.export.tokenizer import read_tokenizer

    tok = read_tokenizer(tokenizer_json)
    sot, eot = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    cfg = CLIPConfig(
        text_config={
            "vocab_size": max(vocab_size or 0, tok.get_vocab_size()),
            "hidden_size": text_width,
            "intermediate_size": 4 * text_width,
            "num_hidden_layers": text_layers,
            "num_attention_heads": text_heads,
            "max_position_embeddings": context_length,
            "bos_token_id": sot,
            "eos_token_id": eot,
            "pad_token_id": eot,
        },
        vision_config={
            "hidden_size": vision_width,
            "intermediate_size": 4 * vision_width,
            "num_hidden_layers": vision_layers,
            "num_attention_heads": vision_heads,
            "image_size": image_size,
            "patch_size": patch,
        },
        projection_dim=projection_dim,
    )
    torch.manual_seed(seed)
    model = CLIPModel(cfg).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    fast = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json),
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.save_pretrained(str(out_dir))
    save_image_processor(out_dir, image_size)
    return out_dir
