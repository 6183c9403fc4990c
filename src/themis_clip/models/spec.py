"""``ModelSpec``: what a model source declares, independent of where it came from.

Its image and text parts (:class:`ImageSpec`, :class:`TextSpec`) live in
:mod:`themis_clip.inputspec`, below both ``models`` and ``preprocess`` (which reads them), and
are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from themis_clip.inputspec import (
    LANGUAGE_PREFIXES,
    PADDING,
    SPECIAL_TOKENS,
    TEXT_CLEANING,
    ImageSpec,
    TextSpec,
)
from themis_clip.vocabulary import Layout

__all__ = [
    "LANGUAGE_PREFIXES",
    "PADDING",
    "SPECIAL_TOKENS",
    "TEXT_CLEANING",
    "ImageSpec",
    "ModelSpec",
    "TextSpec",
]


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
