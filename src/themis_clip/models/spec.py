"""``ModelSpec``: what a model source declares, independent of where it came from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from themis_clip.vocabulary import CLIP_MEAN, CLIP_STD, Layout, ResizeMode

__all__ = ["ImageSpec", "ModelSpec"]


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """Image preprocessing the model was trained with."""

    image_size: int = 224
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    resize_mode: ResizeMode = ResizeMode.SHORTEST
    interpolation: str = "bicubic"
    fill: tuple[int, int, int] = (0, 0, 0)


#: text cleaning rules: OpenAI's exact ``whitespace_clean(basic_clean(t)).lower()``, and
#: open_clip's ``tokenizer_kwargs.clean`` choices (``canonicalize``: SigLIP; ``lower``,
#: ``whitespace``), or none
TEXT_CLEANING = ("openai", "canonicalize", "lower", "whitespace", "none")
#: who adds the special tokens: this package (CLIP's SOT ... EOT) or the tokenizer's own
#: post-processor (SigLIP's appended EOS, BERT's CLS/SEP, XLM-R's <s></s>)
SPECIAL_TOKENS = ("clip", "tokenizer")
#: how a batch is padded: to its longest row (graphs that take a mask or pool at EOT) or to the
#: full context (graphs that pool the last position: SigLIP)
PADDING = ("longest", "max_length")
#: language prefixes: Flores-200 codes glued to the text with no space (NLLB-SigLIP, as immich)
LANGUAGE_PREFIXES = ("flores200",)


@dataclass(frozen=True, kw_only=True)
class TextSpec:
    """How text becomes token ids for one model: part of its description, never a guess.

    Attributes:
        special_tokens: ``"clip"`` or ``"tokenizer"`` (see :data:`SPECIAL_TOKENS`).
        padding: ``"longest"`` or ``"max_length"`` (see :data:`PADDING`).
        attention_mask: True: the graph must take a mask; False: it must not; None: as the
            graph declares.
        clean: one of :data:`TEXT_CLEANING`.
        language_prefix: None, or ``"flores200"``.
        default_language: the code used when a caller gives none (None: callers must give one).
    """

    special_tokens: str = "clip"
    padding: str = "longest"
    attention_mask: bool | None = None
    clean: str = "openai"
    language_prefix: str | None = None
    default_language: str | None = None

    def problems(self) -> list[str]:
        """What is wrong with this description (empty: nothing)."""
        out = []
        for name, value, allowed in (
            ("special_tokens", self.special_tokens, SPECIAL_TOKENS),
            ("padding", self.padding, PADDING),
            ("clean", self.clean, TEXT_CLEANING),
        ):
            if value not in allowed:
                out.append(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        if self.language_prefix is not None and self.language_prefix not in LANGUAGE_PREFIXES:
            out.append(
                f"language_prefix must be one of {', '.join(LANGUAGE_PREFIXES)}; "
                f"got {self.language_prefix!r}"
            )
        return out


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A resolved model source.

    Attributes:
        name: model name (manifest, config, or file stem).
        layout: which layout was detected (``"file"``, ``"themis"``).
        root: the directory holding the files.
        visual_path: image tower ONNX file.
        textual_path: text tower ONNX file, if any.
        tokenizer_path: ``tokenizer.json`` for the text tower, if any.
        embedding_dim: dimension the source declares (None: read from the session).
        image: preprocessing settings.
        context_length: text context length (tokens, SOT and EOT included).
        pad_id: id used to pad token sequences (None: the tokenizer's, else 0 like OpenAI).
        variant: precision variant loaded (``"fp32"``, ``"fp16"``, ``"int8"``, ...).
        manifest_path: the manifest file, for directory layouts.
        declared_sha256: relative file name → digest, as the manifest lists them.
        logit_scale: the checkpoint's learned temperature, ``exp(logit_scale)`` (zero-shot
            scores are ``logit_scale * cosine``; None: unknown, OpenAI CLIP's 100 is used).
        logit_bias: SigLIP's learned bias (scores pass a sigmoid); None for softmax models.
        text: how text becomes token ids (tokenizer kind, padding, mask, cleaning, language).
        pooler_is_embedding: the towers' ``pooler_output`` is the embedding (SigLIP's head is
            its pooler); for CLIP a ``pooler_output`` lacks the projection and is refused.
    """

    name: str
    layout: Layout
    root: Path
    visual_path: Path
    textual_path: Path | None = None
    tokenizer_path: Path | None = None
    embedding_dim: int | None = None
    image: ImageSpec = field(default_factory=ImageSpec)
    context_length: int = 77
    pad_id: int | None = None
    variant: str = "fp32"
    manifest_path: Path | None = None
    declared_sha256: Mapping[str, str] = field(default_factory=dict)
    logit_scale: float | None = None
    logit_bias: float | None = None
    text: TextSpec = field(default_factory=TextSpec)
    pooler_is_embedding: bool = False

    def model_files(self) -> list[Path]:
        """Every file the model is made of (towers, tokenizer, external data)."""
        files = [self.visual_path]
        if self.textual_path is not None:
            files.append(self.textual_path)
        if self.tokenizer_path is not None:
            files.append(self.tokenizer_path)
        for rel in self.declared_sha256:
            path = self.root / rel
            if path not in files:
                files.append(path)
        return files
