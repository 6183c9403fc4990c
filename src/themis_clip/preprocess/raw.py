"""Camera RAW files (CR2, CR3, NEF, ARW, DNG, RAF, ORF, RW2): the only module that imports
``rawpy`` (LibRaw).

A RAW file is read through the preview the camera embedded (a full-size or large JPEG in most
RAWs: decoded by Pillow under the same budgets as any JPEG), else decoded by LibRaw at half
size (CLIP reads 224 to 448 pixels; half size skips demosaicing and needs a quarter of the
memory), after its declared size is checked against the pixel limit.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.errors import ImageDecodeError, ImageTooLargeError
from themis_clip.files import RAW_SUFFIXES

__all__ = ["RAW_SUFFIXES", "RawImage", "looks_raw", "raw_size", "read_raw"]


# LibRaw's flip → the EXIF orientation that rights the image.
_FLIP_TO_ORIENTATION = {3: 3, 5: 8, 6: 6}
# What LibRaw holds at most while decoding at half size, per output pixel (the raw plane, its
# 4-channel 16-bit image and the 8-bit RGB result).
_BYTES_PER_PIXEL = 8 * 4 + 2 + 3


@dataclass(frozen=True, kw_only=True)
class RawImage:
    """A RAW file's picture: the embedded preview's bytes (``jpeg``) or LibRaw's decode
    (``rgb``, HxWx3 uint8), and the EXIF orientation that rights it (1: upright)."""

    jpeg: bytes | None = None
    rgb: npt.NDArray[np.uint8] | None = None
    orientation: int = 1


@functools.cache
def _rawpy() -> Any:
    try:
        import rawpy
    except ImportError:
        return None
    return rawpy


def looks_raw(head: bytes, suffix: str | None) -> bool:
    """True where ``head`` (the file's first 16 bytes) or its suffix says camera RAW, or a TIFF
    header that LibRaw may know (NEF, ARW, DNG and CR2 are TIFF-shaped)."""
    if suffix is not None and suffix.lower() in RAW_SUFFIXES:
        return True
    return (
        head[4:12] == b"ftypcrx "  # CR3
        or head.startswith((b"FUJIFILMCCD-RAW", b"IIRO", b"IIRS", b"MMOR", b"IIU\x00"))
        or head[:4] in (b"II*\x00", b"MM\x00*")
    )


def raw_support() -> bool:
    """Whether RAW files can be read here (``rawpy`` installed: the ``photos`` extra)."""
    return _rawpy() is not None


def raw_size(source: str | Path | bytes) -> tuple[int, int] | None:
    """The upright ``(width, height)`` LibRaw decodes a RAW file to, read from its header
    (nothing unpacked); None where ``rawpy`` is missing or LibRaw does not know the file."""
    rawpy = _rawpy()
    if rawpy is None:
        return None
    raw = rawpy.RawPy()
    try:
        if isinstance(source, bytes):
            raw.open_buffer(io.BytesIO(source))
        else:
            raw.open_file(str(source))
    except rawpy.LibRawError:
        raw.close()
        return None
    with raw:
        width, height = raw.sizes.width, raw.sizes.height
        if raw.sizes.flip in (5, 6):  # a quarter turn: LibRaw rights it on decode
            width, height = height, width
    return (int(width), int(height)) if width > 0 and height > 0 else None


def read_raw(
    data: bytes | memoryview,
    *,
    max_image_pixels: int,
    reserve: Callable[[int, int], None] | None = None,
) -> RawImage | None:
    """The picture of a RAW file, or None where LibRaw does not know ``data`` (a plain TIFF).

    Raises:
        ImageDecodeError: a RAW LibRaw cannot decode; a RAW here without ``rawpy`` installed.
        ImageTooLargeError: the sensor has more than ``max_image_pixels`` pixels.
    """
    rawpy = _rawpy()
    if rawpy is None:
        return None
    raw = rawpy.RawPy()
    try:
        raw.open_buffer(io.BytesIO(bytes(data)))  # the header only: nothing unpacked yet
    except (rawpy.LibRawFileUnsupportedError, rawpy.LibRawIOError):
        raw.close()
        return None
    except rawpy.LibRawError as exc:
        raw.close()
        raise ImageDecodeError(f"damaged camera RAW file: {exc}") from None
    with raw:
        orientation = _FLIP_TO_ORIENTATION.get(raw.sizes.flip, 1)
        try:
            thumb = raw.extract_thumb()
        except (rawpy.LibRawNoThumbnailError, rawpy.LibRawUnsupportedThumbnailError):
            thumb = None
        except rawpy.LibRawError as exc:
            raise ImageDecodeError(f"damaged camera RAW preview: {exc}") from None
        if thumb is not None and thumb.format == rawpy.ThumbFormat.JPEG:
            return RawImage(jpeg=bytes(thumb.data), orientation=orientation)
        width, height = raw.sizes.width, raw.sizes.height
        if width * height > max_image_pixels:
            raise ImageTooLargeError(
                f"camera RAW of {width}x{height} = {width * height} pixels, above the limit "
                f"of {max_image_pixels} (max_image_pixels)"
            )
        out_pixels = (width // 2) * (height // 2)
        if reserve is not None:
            reserve(out_pixels * _BYTES_PER_PIXEL, out_pixels)
        try:
            raw.unpack()
            rgb = raw.postprocess(half_size=True, use_camera_wb=True, output_bps=8)
        except rawpy.LibRawError as exc:
            raise ImageDecodeError(f"damaged camera RAW data: {exc}") from None
    return RawImage(rgb=np.ascontiguousarray(rgb, dtype=np.uint8))  # LibRaw rights it itself
