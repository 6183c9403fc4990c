"""``ModelSpec``: what a model source declares, independent of where it came from."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

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

__all__ = ["ImageSpec", "ModelSpec", "TextSpec"]

_E = TypeVar("_E", bound=enum.StrEnum)


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """Image preprocessing the model was trained with."""

    image_size: int = 224
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    resize_mode: ResizeMode = ResizeMode.SHORTEST
    interpolation: str = "bicubic"
    fill: tuple[int, int, int] = (0, 0, 0)


#: the closed sets' values, kept for callers of the tuples (the enums are in ``vocabulary``)
TEXT_CLEANING = tuple(c.value for c in TextCleaning)
SPECIAL_TOKENS = tuple(c.value for c in SpecialTokens)
PADDING = tuple(c.value for c in Padding)
LANGUAGE_PREFIXES = tuple(c.value for c in LanguagePrefix)


@dataclass(frozen=True, kw_only=True)
class TextSpec:
    """How text becomes token ids for one model: part of its description, never a guess.

    :meth:`parse` builds one from a description's strings and names what is not allowed.

    Attributes:
        special_tokens: who adds the special tokens (:class:`SpecialTokens`).
        padding: to the longest row or the full context (:class:`Padding`).
        attention_mask: True: the graph must take a mask; False: it must not; None: as the
            graph declares.
        clean: the text cleaning rule (:class:`TextCleaning`).
        language_prefix: None, or :attr:`LanguagePrefix.FLORES200`.
        default_language: the code used when a caller gives none (None: callers must give one).
    """

    special_tokens: SpecialTokens = SpecialTokens.CLIP
    padding: Padding = Padding.LONGEST
    attention_mask: bool | None = None
    clean: TextCleaning = TextCleaning.OPENAI
    language_prefix: LanguagePrefix | None = None
    default_language: str | None = None

    @classmethod
    def parse(
        cls,
        *,
        special_tokens: str,
        padding: str,
        attention_mask: bool | None,
        clean: str,
        language_prefix: str | None,
        default_language: str | None,
    ) -> tuple[TextSpec | None, list[str]]:
        """A spec from a description's strings: ``(spec, [])``, or ``(None, problems)`` naming
        each field that is not one of its closed set."""
        problems: list[str] = []

        def pick(name: str, kind: type[_E], value: str) -> _E:
            member = member_of(kind, value)
            if member is None:
                allowed = ", ".join(k.value for k in kind)
                problems.append(f"{name} must be one of {allowed}; got {value!r}")
            return member  # type: ignore[return-value]  # only used when no problems

        spec = cls(
            special_tokens=pick("special_tokens", SpecialTokens, special_tokens),
            padding=pick("padding", Padding, padding),
            attention_mask=attention_mask,
            clean=pick("clean", TextCleaning, clean),
            language_prefix=(
                None
                if language_prefix is None
                else pick("language_prefix", LanguagePrefix, language_prefix)
            ),
            default_language=default_language,
        )
        return (None, problems) if problems else (spec, [])


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
