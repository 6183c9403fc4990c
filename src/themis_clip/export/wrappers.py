"""The torch modules the exporter traces: each family's towers as ``embedding = f(inputs)``
(the family table, :mod:`themis_clip.models.families`, says which wrapper a family uses)."""

from __future__ import annotations

from typing import Any

import torch

from themis_clip.models.families import Family, VisualInput

__all__ = ["MaskedTextual", "PatchVisual", "Textual", "Visual", "visual_module"]


class Visual(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model.get_image_features(pixel_values=pixel_values)
        return out if torch.is_tensor(out) else out.pooler_output


class Textual(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # CLIP's text tower is causal and pools at EOT: trailing padding needs no mask.
        out = self.model.get_text_features(input_ids=input_ids)
        return out if torch.is_tensor(out) else out.pooler_output


class PatchVisual(torch.nn.Module):
    """SigLIP 2 at a fixed resolution: ``pixel_values [N,3,S,S]`` cut into the patches the NaFlex
    vision tower takes (the processor's ``convert_image_to_patches`` order), all valid."""

    def __init__(self, model: Any, patch: int) -> None:
        super().__init__()
        self.model, self.patch = model, patch

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        n, c, h, w = pixel_values.shape
        p = self.patch
        rows, cols = h // p, w // p
        patches = (
            pixel_values.reshape(n, c, rows, p, cols, p)
            .permute(0, 2, 4, 3, 5, 1)
            .reshape(n, rows * cols, p * p * c)
        )
        mask = torch.ones(n, rows * cols, dtype=torch.int64)
        shapes = torch.tensor([[rows, cols]], dtype=torch.int64).expand(n, 2)
        out = self.model.get_image_features(
            pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes
        )
        return out if torch.is_tensor(out) else out.pooler_output


class MaskedTextual(torch.nn.Module):
    """Text towers that take an attention mask (BERT, XLM-R: bidirectional, masked pooling)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        return out if torch.is_tensor(out) else out.pooler_output


def visual_module(model: Any, fam: Family) -> torch.nn.Module:
    """The export wrapper of the family's image tower."""
    if fam.visual is VisualInput.PATCHES:
        return PatchVisual(model, int(model.config.vision_config.patch_size))
    return Visual(model)
