"""The pictures OCR reads: decoded once, then resized for detection and cut into text lines.

The crops follow PaddleOCR's ``get_rotate_crop_image``: each detected quadrilateral is warped to
an upright rectangle at its own size, then resized to the recogniser's height (Pillow's
antialiasing resize; PaddleOCR's OpenCV resize does not antialias).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from themis_clip.files import open_regular
from themis_clip.interface import ImageData
from themis_clip.preprocess.image import decode_image
from themis_clip.vocabulary import DEFAULT_MAX_IMAGE_PIXELS

__all__ = ["OCRPicture", "decode_for_ocr", "squeeze_width"]


class OCRPicture:
    """A decoded RGB picture and the arrays OCR takes from it (HWC uint8, RGB).

    ``full_size`` is the upright size of the whole picture; a JPEG decoded at a DCT scale for
    the gate is smaller (``reduced``).
    """

    def __init__(self, image: Image.Image, full_size: tuple[int, int] | None = None) -> None:
        self._image = image
        self.full_size = full_size or image.size

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` in pixels, as decoded."""
        return self._image.size

    @property
    def reduced(self) -> bool:
        """Whether this is a DCT-scaled decode, smaller than the picture."""
        return self._image.size != self.full_size

    def resized(self, width: int, height: int) -> npt.NDArray[np.uint8]:
        """The whole picture resized to ``width`` × ``height`` (bilinear, antialiased)."""
        img = self._image
        if img.size != (width, height):
            img = img.resize((width, height), Image.Resampling.BILINEAR, reducing_gap=2.0)
        return np.asarray(img, dtype=np.uint8)

    def line(self, quad: npt.NDArray[np.float32], *, height: int, max_width: int) -> Any:
        """The text line inside ``quad`` (4×2 points clockwise from the line's top-left, in
        pixels), warped upright, ``height`` pixels high and at most ``max_width`` wide."""
        q = np.asarray(quad, dtype=np.float64)
        w = max(1, round(max(np.linalg.norm(q[1] - q[0]), np.linalg.norm(q[2] - q[3]))))
        h = max(1, round(max(np.linalg.norm(q[3] - q[0]), np.linalg.norm(q[2] - q[1]))))
        # QUAD takes the source corners as upper-left, lower-left, lower-right, upper-right.
        data = tuple(float(v) for v in q[[0, 3, 2, 1]].ravel())
        crop = self._image.transform(
            (w, h), Image.Transform.QUAD, data, resample=Image.Resampling.BILINEAR
        )
        out_w = max(1, min(max_width, math.ceil(height * w / h)))
        return np.asarray(crop.resize((out_w, height), Image.Resampling.BILINEAR), np.uint8)


def squeeze_width(lines: Sequence[npt.NDArray[np.uint8]], max_width: int) -> list[Any]:
    """``lines`` with those wider than ``max_width`` squeezed to it (the classifier's input)."""
    out: list[Any] = []
    for arr in lines:
        if arr.shape[1] <= max_width:
            out.append(arr)
        else:
            img = Image.fromarray(arr).resize((max_width, arr.shape[0]), Image.Resampling.BILINEAR)
            out.append(np.asarray(img, dtype=np.uint8))
    return out


def decode_for_ocr(
    data: ImageData,
    *,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    apply_exif: bool = True,
    reserve: Callable[[int, int], None] | None = None,
    draft_min_side: int | None = None,
) -> OCRPicture:
    """Decode ``data`` upright, as RGB (transparency composited onto white): at full size
    (boxes are reported in its pixels), or, with ``draft_min_side``, a JPEG at the smallest
    DCT scale that keeps its shorter side at least that long (the gate's picture: a 12 MP
    JPEG decodes 3x faster).

    ``reserve``: as :func:`decode_image` (a pixel budget's lease holds the decode).

    Raises:
        ImageDecodeError, ImageTooLargeError, InputError: as :func:`decode_image`.
    """
    full = _jpeg_size(data, apply_exif) if draft_min_side is not None else None
    img = decode_image(
        data,
        max_image_pixels=max_image_pixels,
        apply_exif=apply_exif,
        reserve=reserve,
        draft_min_side=draft_min_side if full is not None else None,
    )
    if img.has_transparency_data:  # onto white, as RapidOCR's loader does: transparent
        # pixels are often stored black, and black text would vanish into them
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return OCRPicture(img, full)


_JPEG_MAGIC = b"\xff\xd8\xff"
_HEADER_BYTES = 1 << 20  # the size and EXIF of a JPEG are in its first segments
_TURNS_SIDEWAYS = frozenset({5, 6, 7, 8})  # EXIF orientations that swap width and height


def _jpeg_size(data: ImageData, apply_exif: bool) -> tuple[int, int] | None:
    """A JPEG's upright size from its header; None for anything else or an unreadable header."""
    try:
        if isinstance(data, bytes | bytearray | memoryview):
            if bytes(data[:3]) != _JPEG_MAGIC:
                return None
            img = Image.open(io.BytesIO(data))
        elif isinstance(data, str | os.PathLike):
            with open_regular(data) as fh:
                if fh.read(3) != _JPEG_MAGIC:
                    return None
                fh.seek(0)
                img = Image.open(io.BytesIO(fh.read(_HEADER_BYTES)))
        else:
            return None
        with img:
            width, height = img.size
            turn = img.getexif().get(0x0112) if apply_exif else None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    return (height, width) if turn in _TURNS_SIDEWAYS else (width, height)
