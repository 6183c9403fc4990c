"""Model families as data: the one table of each family's rules.

A family is what a checkpoint's ``config.json`` ``model_type`` names. Its entry says how text
becomes token ids (the :class:`~themis_clip.models.spec.TextSpec` the exporter writes into the
manifest), how the text context is found, what the image tower takes, which ``transformers``
class and export wrapper the exporter uses, and what peers' layouts of that family imply
(transformers.js: whether the towers' ``pooler_output`` is the embedding). The exporter
(:mod:`themis_clip.export.hf`) and the peers' layouts (:mod:`themis_clip.models.peers`) only
read this table, so a new family is one entry here plus one parity test
(``tests/integration/test_families.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from themis_clip.models.spec import TextSpec
from themis_clip.vocabulary import Padding, SpecialTokens, TextCleaning

__all__ = ["FAMILIES", "Family", "VisualInput", "family"]


class VisualInput(enum.StrEnum):
    """What the exported image tower is built around (the exporter picks its wrapper by this)."""

    PIXELS = "pixels"  # get_image_features(pixel_values [N, 3, S, S])
    #: SigLIP 2's NaFlex tower at a fixed resolution: the square image cut into patches (the
    #: processor's convert_image_to_patches order), S the tower's patch budget as a square,
    #: squashed; its runtime shape checks are off while exporting
    PATCHES = "patches"


@dataclass(frozen=True, kw_only=True)
class Family:
    """One model family's rules.

    Attributes:
        model_type: ``config.json``'s ``model_type``.
        hf_class: the ``transformers`` class that loads the checkpoint (the parity reference).
        text: how text becomes ids; CLIP's default spec means "the CLIP path" (the manifest
            records nothing), any other is written into the manifest's ``textual``.
        context_from_tokenizer: the context is the tokenizer's ``model_max_length`` within the
            position table (BERT/XLM-R towers with 512 positions; Chinese-CLIP declares 52);
            False: the position table itself (CLIP, SigLIP).
        position_offset: positions the table holds before the first token (RoBERTa: 2).
        visual: what the image tower takes (:class:`VisualInput`).
        pooler_is_embedding: the towers' ``pooler_output`` is the embedding (SigLIP's head is
            its pooler); peers' layouts that export the bare towers (transformers.js) rely on it.
    """

    model_type: str
    hf_class: str
    text: TextSpec = field(default_factory=TextSpec)
    context_from_tokenizer: bool = False
    position_offset: int = 0
    visual: VisualInput = VisualInput.PIXELS
    pooler_is_embedding: bool = False

    @property
    def manifest_text(self) -> dict[str, Any]:
        """What the exporter adds to the manifest's ``textual`` (nothing for the CLIP path)."""
        if self.text == TextSpec():
            return {}
        return {
            "special_tokens": self.text.special_tokens.value,
            "padding": self.text.padding.value,
            "attention_mask": self.text.attention_mask,
            "clean": self.text.clean.value,
        }


def _last_token(clean: TextCleaning) -> TextSpec:
    """SigLIP's rule: the last position is pooled, so rows are padded to the full context with
    the pad id and no mask; the SentencePiece tokenizer appends EOS itself."""
    return TextSpec(
        special_tokens=SpecialTokens.TOKENIZER,
        padding=Padding.MAX_LENGTH,
        attention_mask=False,
        clean=clean,
    )


def _masked() -> TextSpec:
    """BERT (Chinese-CLIP) and XLM-R (AltCLIP): bidirectional, so the mask is an input; their
    tokenizer.json adds [CLS]/[SEP] or <s></s> and normalises text itself."""
    return TextSpec(
        special_tokens=SpecialTokens.TOKENIZER,
        padding=Padding.LONGEST,
        attention_mask=True,
        clean=TextCleaning.NONE,
    )


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family(model_type="clip", hf_class="CLIPModel"),
        Family(
            model_type="siglip",
            hf_class="SiglipModel",
            text=_last_token(TextCleaning.CANONICALIZE),  # open_clip's canonicalize
            pooler_is_embedding=True,
        ),
        # SigLIP 2 at a fixed resolution: SigLIP's text rule, its Gemma tokenizer on lower case.
        Family(
            model_type="siglip2",
            hf_class="Siglip2Model",
            text=_last_token(TextCleaning.LOWER),
            visual=VisualInput.PATCHES,
            pooler_is_embedding=True,
        ),
        Family(
            model_type="chinese_clip",
            hf_class="ChineseCLIPModel",
            text=_masked(),
            context_from_tokenizer=True,
        ),
        Family(
            model_type="altclip",
            hf_class="AltCLIPModel",
            text=_masked(),
            context_from_tokenizer=True,
            position_offset=2,  # RoBERTa's positions start after the padding index
        ),
    )
}


def family(model_type: object) -> Family | None:
    """The family ``model_type`` names, or None (an unknown or missing type)."""
    return FAMILIES.get(model_type) if isinstance(model_type, str) else None
