"""High-depth greyscale (16- and 32-bit integers, floats) to 8 bits, a strip of rows at a time.

Pillow's own conversion clips at 255 (every 16-bit PNG turns white), and whole-image float
temporaries cost 4.5 GB for a 321 kB 13000² PNG: here integers stay integers and only about
4 megapixels are converted at once. 16-bit samples map as ``round(v / 257)``; 32-bit ones by
their declared range (a TIFF's BitsPerSample and SampleFormat), not as if they were 16-bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["to_8bit"]

#: rows of a high-depth image converted at a time: about 4 megapixels
_STRIP_PIXELS = 1 << 22


def to_8bit(
    size: tuple[int, int],
    strip: Callable[[int, int], npt.NDArray[Any]],
    mode: str,
    fmt: str | None,
    *,
    bits: Any = None,
    sample_format: Any = None,
) -> npt.NDArray[np.uint8]:
    """The 8-bit greyscale of a ``mode`` image (``I;16*``, ``I`` or ``F``) of ``size``.

    ``strip(y0, y1)`` returns rows ``y0:y1`` as an array; ``fmt`` is the Pillow format, and
    ``bits`` / ``sample_format`` a TIFF's BitsPerSample and SampleFormat tags.

    Returns:
        uint8 array of shape ``(height, width)``.
    """
    width, height = size
    rows = max(1, _STRIP_PIXELS // width)
    strips = [(y, min(height, y + rows)) for y in range(0, height, rows)]
    out = np.empty((height, width), dtype=np.uint8)
    if mode == "F":
        peak = max(float(np.nanmax(strip(*s), initial=0.0)) for s in strips)
        gain = 255.0 if peak <= 1.0 else 1.0
        for y0, y1 in strips:
            scaled = np.nan_to_num(strip(y0, y1).astype(np.float32) * gain)
            out[y0:y1] = np.clip(scaled, 0, 255).round()
        return out
    top, signed = _integer_range(mode, fmt, bits, sample_format, strips, strip)
    for y0, y1 in strips:
        values = strip(y0, y1)
        if not signed and values.dtype == np.int32:
            values = values.view(np.uint32)  # unsigned 32-bit samples Pillow holds as int32
        wide = np.clip(values.astype(np.int64), 0, top)
        # round(v * 255 / top) in integers (for 16 bits: exactly round(v / 257), no ties)
        out[y0:y1] = (wide * 255 + top // 2) // top
    return out


def _first(value: Any, default: int) -> int:
    """A TIFF tag's first value (tags hold one value or a tuple)."""
    if isinstance(value, tuple):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) else default


def _integer_range(
    mode: str,
    fmt: str | None,
    bits: Any,
    sample_format: Any,
    strips: list[tuple[int, int]],
    strip: Callable[[int, int], npt.NDArray[Any]],
) -> tuple[int, bool]:
    """(the value that maps to 255, whether samples are signed) for an integer image.

    16-bit modes and PNG (whose ``I`` images hold 16-bit samples) are 16-bit; a TIFF says its
    depth (BitsPerSample) and sign (SampleFormat); any other ``I`` image is 16-bit unless a
    sample exceeds 65535, then signed 32-bit.
    """
    if mode != "I" or fmt == "PNG":
        return 65535, False
    if fmt == "TIFF" and bits is not None:
        depth = _first(bits, 16)
        signed = _first(sample_format, 1) == 2  # SampleFormat 2: two's-complement integers
        return (1 << (depth - 1)) - 1 if signed else (1 << depth) - 1, signed
    peak = max(int(strip(*s).max(initial=0)) for s in strips)
    return (65535, False) if peak <= 65535 else ((1 << 31) - 1, True)
