"""Recogniser and classifier tensors, and CTC decoding (PaddleOCR's ``CTCLabelDecode``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["ctc_decode", "line_batch", "load_alphabet"]


def load_alphabet(characters: Sequence[str]) -> tuple[str, ...]:
    """The CTC classes: blank, the model's characters, then the space PaddleOCR appends."""
    return ("", *characters, " ")


def line_batch(lines: Sequence[npt.NDArray[np.uint8]], width: int) -> npt.NDArray[np.float32]:
    """Lines (H×w×3 RGB uint8, one height) as a BGR N×3×H×``width`` batch scaled to [-1, 1],
    padded on the right with zeros (PaddleOCR's ``resize_norm_img``)."""
    h = lines[0].shape[0]
    batch = np.zeros((len(lines), 3, h, width), dtype=np.float32)
    for i, arr in enumerate(lines):
        w = min(arr.shape[1], width)
        chw = arr[:, :w, ::-1].transpose(2, 0, 1).astype(np.float32)
        batch[i, :, :, :w] = chw / 127.5 - 1.0
    return batch


def ctc_decode(probs: npt.NDArray[np.float32], alphabet: Sequence[str]) -> list[tuple[str, float]]:
    """Greedy CTC decoding of N×T×C class probabilities.

    Returns:
        ``(text, confidence)`` per row; confidence is the mean probability of the kept
        characters (0 for an empty line).
    """
    best = probs.argmax(axis=2)
    score = probs.max(axis=2)
    out: list[tuple[str, float]] = []
    for ids, ps in zip(best, score, strict=True):
        keep = ids != 0
        keep[1:] &= ids[1:] != ids[:-1]
        chosen = ids[keep]
        text = "".join(alphabet[i] if i < len(alphabet) else "" for i in chosen.tolist())
        out.append((text, float(ps[keep].mean()) if chosen.size else 0.0))
    return out
