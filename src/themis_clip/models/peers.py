"""Model directories exported by other projects, loaded as they are.

=================  =========================================================================
layout             recognised by
=================  =========================================================================
``immich``         ``visual/model.onnx`` (+ ``textual/model.onnx``, ``textual/tokenizer.json``),
                   ``config.json`` (``embed_dim``, ``text_cfg.context_length``),
                   ``visual/preprocess_cfg.json`` (size, mean, std, interpolation,
                   resize_mode); batch fixed at 1, outputs already normalised
``transformers.js`` ``onnx/vision_model.onnx`` (+ ``onnx/text_model.onnx``) with dtype-suffixed
                   variants (``_fp16``, ``_int8``, ``_quantized``, ``_q4``, ...),
                   ``preprocessor_config.json``, ``tokenizer.json``, ``config.json``
``clip-as-service`` ``visual.onnx`` (+ ``textual.onnx``) without a manifest
``lakera``         ``clip_image_model_*.onnx`` (+ ``clip_text_model_*.onnx``)
=================  =========================================================================

Names, dtypes and batch axes are read from the sessions later (``engine``); this module only
finds the files and the preprocessing/tokenizer settings the directory declares. A text tower
without a ``tokenizer.json`` (clip-as-service and lakera ship theirs outside the model folder)
is loaded image-only unless ``model.tokenizer_path`` names one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import themis_clip.jsonio as jsonio
from themis_clip.errors import ModelFormatError
from themis_clip.files import resolves_outside
from themis_clip.models.families import family
from themis_clip.models.spec import ImageSpec, ModelSpec, TextSpec
from themis_clip.vocabulary import (
    CLIP_MEAN,
    CLIP_STD,
    LanguagePrefix,
    Layout,
    Padding,
    ResizeMode,
    SpecialTokens,
    TextCleaning,
    member_of,
)

__all__ = ["HF_RESAMPLE", "XENOVA_SUFFIXES", "detect_peer_layout", "stay_inside"]

#: transformers.js file suffix per variant name.
XENOVA_SUFFIXES = {
    "fp32": "",
    "fp16": "_fp16",
    "int8": "_int8",
    "uint8": "_uint8",
    "quantized": "_quantized",
    "q4": "_q4",
    "q4f16": "_q4f16",
    "bnb4": "_bnb4",
}
#: Hugging Face image processors' ``resample`` (PIL enum values) → our interpolation names.
HF_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def stay_inside(root: Path, file: Path) -> None:
    """Refuse a model file that leaves the model folder ``root`` once links are resolved.

    The one place links may lead is a Hugging Face cache snapshot's own ``blobs`` folder (its
    files are links into it).

    Raises:
        ModelFormatError: naming the file and where it leads.
    """
    roots = [root]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    target = resolves_outside(file, *roots)
    if target is not None:
        raise ModelFormatError(
            f"{file} leaves the model folder {root} (it resolves to {target}); a model "
            "loads only files inside its folder"
        )


def _json(root: Path, path: Path) -> dict[str, Any]:
    if not path.is_file() and not path.is_symlink():
        return {}
    stay_inside(root, path)
    try:
        data = jsonio.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} must hold a JSON object")
    return data


def _size(value: Any, where: Path) -> int | None:
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("shortest_edge") or value.get("height")
    if isinstance(value, list | tuple):
        if len(value) != 2 or value[0] != value[1]:
            raise ModelFormatError(f"{where}: only square model inputs are supported, got {value}")
        value = value[0]
    if not isinstance(value, int) or value <= 0:
        raise ModelFormatError(f"{where}: image size must be a positive integer, got {value!r}")
    return value


def _triple(
    value: Any, default: tuple[float, float, float], where: Path
) -> tuple[float, float, float]:
    if value is None:
        return default
    if isinstance(value, int | float):
        return (float(value),) * 3
    if (
        isinstance(value, list)
        and len(value) == 3
        and all(isinstance(v, int | float) for v in value)
    ):
        return (float(value[0]), float(value[1]), float(value[2]))
    raise ModelFormatError(f"{where}: mean/std must be three numbers, got {value!r}")


def _resize_mode(value: Any, where: Path) -> ResizeMode:
    try:
        return ResizeMode(value or "shortest")
    except ValueError:
        raise ModelFormatError(f"{where}: unknown resize_mode {value!r}") from None


def _tokenizer(root: Path, *candidates: Path) -> Path | None:
    found = next((c for c in candidates if c.is_file()), None)
    if found is not None:
        stay_inside(root, found)  # read here, before the loader's own check
    return found


def _is_clip_bpe(tokenizer: Path | None) -> bool:
    """Whether a ``tokenizer.json`` is CLIP's BPE (it holds ``<|startoftext|>``)."""
    if tokenizer is None:
        return True  # no tokenizer: image-only unless one is configured (a CLIP one)
    with open(tokenizer, encoding="utf-8", errors="replace") as fh:
        return '"<|startoftext|>"' in fh.read()


def _text_spec(
    tokenizer: Path | None,
    where: Path,
    *,
    clean: Any = None,
    pad_to_context: bool,
    languages: bool = False,
    default_clean: str = "none",
) -> TextSpec:
    """The text rule a peer directory implies. CLIP BPE keeps the exact CLIP path; any other
    tokenizer adds its own special tokens and is cleaned as the peer cleans it."""
    if _is_clip_bpe(tokenizer):
        return TextSpec()
    rule = member_of(TextCleaning, clean or default_clean)
    if rule is None:
        raise ModelFormatError(f"{where}: unknown text cleaning {clean or default_clean!r}")
    return TextSpec(
        special_tokens=SpecialTokens.TOKENIZER,
        padding=Padding.MAX_LENGTH if pad_to_context else Padding.LONGEST,
        clean=rule,
        # NLLB-SigLIP: a Flores-200 code glued in front; immich defaults to English.
        language_prefix=LanguagePrefix.FLORES200 if languages else None,
        default_language="eng_Latn" if languages else None,
    )


def _model_max_length(root: Path, tokenizer: Path | None, positions: int) -> int:
    """The tokenizer's declared context (Chinese-CLIP: 52) within the position table."""
    if tokenizer is None:
        return positions
    declared = _json(root, tokenizer.parent / "tokenizer_config.json").get("model_max_length")
    return declared if isinstance(declared, int) and 2 <= declared <= positions else positions


def _immich(root: Path, variant: str | None, name: str | None) -> ModelSpec:
    _no_variants(root, variant, "immich")
    cfg = _json(root, root / "config.json")
    pre_path = root / "visual" / "preprocess_cfg.json"
    pre = _json(root, pre_path)
    textual = root / "textual" / "model.onnx"
    text_cfg: dict[str, Any] = cfg["text_cfg"] if isinstance(cfg.get("text_cfg"), dict) else {}
    kwargs = text_cfg.get("tokenizer_kwargs")
    tokenizer = _tokenizer(root, root / "textual" / "tokenizer.json")
    label = (name or root.name).lower()
    # immich pads every text to the context length (its graphs take [1, L]); open_clip's
    # HF tokenizers clean with "whitespace" unless the config says otherwise.
    text = _text_spec(
        tokenizer,
        root / "config.json",
        clean=kwargs.get("clean") if isinstance(kwargs, dict) else None,
        pad_to_context=True,
        languages="nllb" in label,
        default_clean="whitespace",
    )
    return ModelSpec(
        name=name or root.name,
        layout=Layout.IMMICH,
        root=root,
        visual_path=root / "visual" / "model.onnx",
        textual_path=textual if textual.is_file() else None,
        tokenizer_path=tokenizer,
        embedding_dim=cfg.get("embed_dim") if isinstance(cfg.get("embed_dim"), int) else None,
        image=ImageSpec(
            image_size=_size(pre.get("size"), pre_path) or 224,
            mean=_triple(pre.get("mean"), CLIP_MEAN, pre_path),
            std=_triple(pre.get("std"), CLIP_STD, pre_path),
            resize_mode=_resize_mode(pre.get("resize_mode"), pre_path),
            interpolation=str(pre.get("interpolation") or "bicubic"),
        ),
        context_length=int(text_cfg.get("context_length") or 77),
        text=text,
    )


def _xenova(root: Path, variant: str | None, name: str | None) -> ModelSpec:
    chosen = variant or "fp32"
    if chosen not in XENOVA_SUFFIXES:
        raise ModelFormatError(
            f"{root}: unknown variant {chosen!r}; known: {', '.join(XENOVA_SUFFIXES)}"
        )
    suffix = XENOVA_SUFFIXES[chosen]
    visual = root / "onnx" / f"vision_model{suffix}.onnx"
    if not visual.is_file():
        present = sorted(
            v
            for v, s in XENOVA_SUFFIXES.items()
            if (root / "onnx" / f"vision_model{s}.onnx").is_file()
        )
        raise ModelFormatError(f"{root}: no variant {chosen!r}; available: {', '.join(present)}")
    textual = root / "onnx" / f"text_model{suffix}.onnx"
    cfg = _json(root, root / "config.json")
    pre_path = root / "preprocessor_config.json"
    pre = _json(root, pre_path)
    text_cfg: dict[str, Any] = (
        cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else {}
    )
    # SigLIP's and Chinese-CLIP's processors resize to height x width without a crop.
    crop = pre.get(
        "do_center_crop", "crop_size" in pre or "shortest_edge" in (pre.get("size") or {})
    )
    size = _size(pre.get("crop_size") if crop else pre.get("size"), pre_path)
    fam = family(cfg.get("model_type"))
    tokenizer = _tokenizer(root, root / "tokenizer.json")
    positions = int(text_cfg.get("max_position_embeddings") or 77)
    # What the family table implies (SigLIP: the full context, padded to it, canonicalize
    # cleaning, pooler_output is the embedding); other families clean nothing and pad to the
    # longest row, within the tokenizer's declared context.
    last_token = fam is not None and fam.text.padding is Padding.MAX_LENGTH
    return ModelSpec(
        name=name or cfg.get("_name_or_path") or root.name,
        layout=Layout.TRANSFORMERS_JS,
        root=root,
        visual_path=visual,
        textual_path=textual if textual.is_file() else None,
        tokenizer_path=tokenizer,
        embedding_dim=cfg.get("projection_dim")
        if isinstance(cfg.get("projection_dim"), int)
        else None,
        image=ImageSpec(
            image_size=size or 224,
            mean=_triple(pre.get("image_mean"), CLIP_MEAN, pre_path),
            std=_triple(pre.get("image_std"), CLIP_STD, pre_path),
            resize_mode=ResizeMode.SHORTEST if crop else ResizeMode.SQUASH,
            interpolation=HF_RESAMPLE.get(pre.get("resample", 3), "bicubic"),
        ),
        context_length=positions if last_token else _model_max_length(root, tokenizer, positions),
        variant=chosen,
        text=_text_spec(
            tokenizer,
            root / "config.json",
            clean=fam.text.clean if fam is not None and last_token else TextCleaning.NONE,
            pad_to_context=last_token,
        ),
        pooler_is_embedding=fam is not None and fam.pooler_is_embedding,
    )


def _clip_as_service(root: Path, variant: str | None, name: str | None) -> ModelSpec:
    _no_variants(root, variant, "clip-as-service")
    textual = root / "textual.onnx"
    tokenizer = _tokenizer(root, root / "tokenizer.json")
    return ModelSpec(
        name=name or root.name,
        layout=Layout.CLIP_AS_SERVICE,
        root=root,
        visual_path=root / "visual.onnx",
        textual_path=textual if textual.is_file() else None,
        tokenizer_path=tokenizer,
        # M-CLIP: an XLM-R tokenizer (with its own special tokens), padded to the longest row,
        # with the attention mask its graph takes.
        context_length=_model_max_length(root, tokenizer, 77)
        if not _is_clip_bpe(tokenizer)
        else 77,
        text=_text_spec(tokenizer, root, pad_to_context=False),
    )


def _lakera(root: Path, variant: str | None, name: str | None) -> ModelSpec:
    _no_variants(root, variant, "lakera")
    visual = sorted(root.glob("clip_image_model_*.onnx"))[0]
    tag = visual.stem.removeprefix("clip_image_model_")
    textual = root / f"clip_text_model_{tag}.onnx"
    return ModelSpec(
        name=name or f"lakera-{tag}",
        layout=Layout.LAKERA,
        root=root,
        visual_path=visual,
        textual_path=textual if textual.is_file() else None,
        tokenizer_path=_tokenizer(root, root / "tokenizer.json"),
    )


def _no_variants(root: Path, variant: str | None, layout: str) -> None:
    if variant not in (None, "fp32"):
        raise ModelFormatError(
            f"{root} ({layout} layout) has no precision variants; got {variant!r}"
        )


_DETECTORS: list[
    tuple[str, Callable[[Path], bool], Callable[[Path, str | None, str | None], ModelSpec]]
] = [
    ("immich", lambda r: (r / "visual" / "model.onnx").is_file(), _immich),
    ("transformers.js", lambda r: any((r / "onnx").glob("vision_model*.onnx")), _xenova),
    ("clip-as-service", lambda r: (r / "visual.onnx").is_file(), _clip_as_service),
    ("lakera", lambda r: any(r.glob("clip_image_model_*.onnx")), _lakera),
]


def detect_peer_layout(root: Path, *, variant: str | None, name: str | None) -> ModelSpec | None:
    """The spec of a peer project's model directory, or None if no known layout matches."""
    for _, matches, build in _DETECTORS:
        if matches(root):
            return build(root, variant, name)
    return None
