"""Pillow's resampling, restated for one axis: the crop of a resize without the resize.

``crop_of_resize(img, new_size, offset, size, filter)`` equals
``img.resize(new_size, filter).crop(offset + size)`` to the bit when one side of ``new_size`` is
the crop's and the other is huge (a 1x100000 image would resize to 224 x 22,400,000 first). It
restates ``libImaging/Resample.c`` (``precompute_coeffs``, ``normalize_coeffs_8bpc``, the 22-bit
fixed-point passes, the pass order of the installed Pillow) for the long axis and lets Pillow
do the short one; palette and 1-bit images follow Pillow's nearest-neighbour scaler
(``ImagingScaleAffine``'s running coordinate sum). Part of the Pillow seam (``preprocess/``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt
from PIL import Image

__all__ = ["crop_of_resize"]


def crop_of_resize(
    img: Image.Image,
    new_size: tuple[int, int],
    offset: tuple[int, int],
    size: int,
    resample: Image.Resampling,
) -> Image.Image:
    """Exactly ``img.resize(new_size, resample).crop(offset + size)`` without the intermediate.

    One axis of ``new_size`` equals ``size`` (the short side); the other is huge. Pillow
    resizes horizontally first, then vertically, each pass rounding to 8 bits. The long axis's
    pass is computed here for the ``size`` surviving outputs only, with Pillow's coefficients
    restated in float64 (same formulas, same order) and its fixed-point accumulation; the short
    axis's pass is Pillow's own, on a strip of the source (it is per row or per column, so the
    strip gives the same values). A box-argument resize is *not* equivalent: Pillow takes the
    box as float32, which moves the filter centres (up to 21 levels measured on noise).
    """
    width, height = img.size
    new_w, new_h = new_size
    left, top = offset
    mode = img.mode
    if (new_w, new_h) == (width, height):  # no resize at all: Image.resize returns a copy
        return img.crop((left, top, left + size, top + size))
    if mode in ("1", "P") or resample is Image.Resampling.NEAREST:
        return _nearest_crop(img, new_size, offset, size)  # Pillow resizes these NEAREST
    premultiplied = {"LA": "La", "RGBA": "RGBa"}.get(mode)
    if premultiplied:  # as Image.resize does for images with alpha
        img = img.convert(premultiplied)
    vertical_first = _vertical_pass_first(width, height, new_w, new_h)
    if new_w == size:  # tall: the vertical pass is the long one, computed here
        _, kk, bounds = _pillow_coeffs(height, new_h, top, size, resample)
        r0, r1 = int(bounds[:, 0].min()), int((bounds[:, 0] + bounds[:, 1]).max())
        strip = img.crop((0, r0, width, r1))
        if vertical_first or width == new_w:
            out = _image_from(_convolve(_bands(strip), kk, bounds[:, 0] - r0, axis=0), img.mode)
            result = out if width == new_w else out.resize((new_w, size), resample)
        else:  # Pillow's horizontal pass on the rows the crop needs, then ours
            strip = strip.resize((new_w, r1 - r0), resample)
            result = _image_from(_convolve(_bands(strip), kk, bounds[:, 0] - r0, axis=0), img.mode)
    else:  # wide: the horizontal pass is the long one, computed here
        _, kk, bounds = _pillow_coeffs(width, new_w, left, size, resample)
        c0, c1 = int(bounds[:, 0].min()), int((bounds[:, 0] + bounds[:, 1]).max())
        strip = img.crop((c0, 0, c1, height))
        if vertical_first and height != new_h:  # Pillow's vertical pass first, then ours
            strip = strip.resize((c1 - c0, new_h), resample)
            result = _image_from(_convolve(_bands(strip), kk, bounds[:, 0] - c0, axis=1), img.mode)
        else:
            out = _image_from(_convolve(_bands(strip), kk, bounds[:, 0] - c0, axis=1), img.mode)
            result = out if height == new_h else out.resize((size, new_h), resample)
    return result.convert(mode) if premultiplied else result


def _vertical_pass_first(width: int, height: int, new_w: int, new_h: int) -> bool:
    """Whether this Pillow runs the vertical pass before the horizontal one for this resize.

    Pillow >= 12.3 does so when the height shrinks by more than twice as many pixels as the
    width (``ImagingResampleInner``); older versions always start horizontally. Which rule
    the installed Pillow follows is found once by a probe whose two orders give different
    pixels.
    """
    shrink = height - new_h
    return shrink > 0 and shrink > (width - new_w) * 2 and _pillow_orders_passes()


@functools.cache
def _pillow_orders_passes() -> bool:
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (192, 29), dtype=np.uint8), "L")
    bicubic = Image.Resampling.BICUBIC
    full = np.asarray(img.resize((27, 109), bicubic))
    vertical = np.asarray(img.resize((29, 109), bicubic).resize((27, 109), bicubic))
    return bool(np.array_equal(full, vertical))


def _bicubic(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    x = np.abs(x)
    near = ((-0.5 + 2.0) * x - (-0.5 + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * -0.5
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _bilinear(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _box(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.where((x > -0.5) & (x <= 0.5), 1.0, 0.0)


def _sinc(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x == 0.0, 1.0, np.sin(x * math.pi) / (x * math.pi))


def _lanczos(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.where((x >= -3.0) & (x < 3.0), _sinc(x) * _sinc(x / 3), 0.0)


def _hamming(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    x = np.abs(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        body = (
            np.sin(x * math.pi)
            / (x * math.pi)
            * (np.float32(0.54) + np.float32(0.46) * np.cos(x * math.pi))
        )
    return np.where(x == 0.0, 1.0, np.where(x >= 1.0, 0.0, body))


# Pillow's filters and supports (libImaging/Resample.c). sin/cos are libm's there and numpy's
# here: equal to the last bit on the platforms tested, which the fixed-point rounding absorbs.
_FILTERS = {
    Image.Resampling.BICUBIC: (_bicubic, 2.0),
    Image.Resampling.BILINEAR: (_bilinear, 1.0),
    Image.Resampling.BOX: (_box, 0.5),
    Image.Resampling.LANCZOS: (_lanczos, 3.0),
    Image.Resampling.HAMMING: (_hamming, 1.0),
}
_PRECISION_BITS = 32 - 8 - 2


def _pillow_coeffs(
    in_size: int, out_size: int, first: int, count: int, resample: Image.Resampling
) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Pillow's ``precompute_coeffs`` + ``normalize_coeffs_8bpc`` for outputs ``first..+count``.

    Returns ``(first, kk, bounds)``: 22-bit fixed-point weights ``(count, ksize)`` and per output
    ``(xmin, n)``, the first source index and how many weights apply.
    """
    filt, base_support = _FILTERS[resample]
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = base_support * filterscale
    ksize = math.ceil(support) * 2 + 1
    center = (np.arange(first, first + count, dtype=np.float64) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - xmin
    taps = np.arange(ksize)
    arg = ((taps[None, :] + xmin[:, None]).astype(np.float64) - center[:, None] + 0.5) * (
        1.0 / filterscale
    )
    live = taps[None, :] < xmax[:, None]
    w = np.where(live, filt(arg), 0.0)
    ww = np.zeros(count)
    for k in range(ksize):  # C's order of summation
        ww = ww + w[:, k]
    w = np.where(ww[:, None] != 0.0, w / np.where(ww == 0.0, 1.0, ww)[:, None], w)
    fixed = w * float(1 << _PRECISION_BITS)
    kk = np.where(fixed < 0, np.trunc(-0.5 + fixed), np.trunc(0.5 + fixed)).astype(np.int64)
    return first, kk, np.stack([xmin, xmax], axis=1)


def _convolve(
    arr: npt.NDArray[np.uint8], kk: npt.NDArray[np.int64], start: npt.NDArray[np.int64], axis: int
) -> npt.NDArray[np.uint8]:
    """One 8-bit Pillow resampling pass along ``axis`` with fixed-point weights ``kk``."""
    length = arr.shape[axis]
    acc: npt.NDArray[np.int64] | None = None
    for k in range(kk.shape[1]):
        idx = np.minimum(start + k, length - 1)  # weights past a window's end are zero
        taken = np.take(arr, idx, axis=axis).astype(np.int64)
        shape = [1] * arr.ndim
        shape[axis] = len(idx)
        term = taken * kk[:, k].reshape(shape)
        acc = term if acc is None else acc + term
    assert acc is not None
    acc += 1 << (_PRECISION_BITS - 1)
    out: npt.NDArray[np.uint8] = np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8)
    return out


def _nearest_crop(
    img: Image.Image, new_size: tuple[int, int], offset: tuple[int, int], size: int
) -> Image.Image:
    """The crop of Pillow's nearest-neighbour resize (how it resizes 1-bit and palette images)."""
    new_w, new_h = new_size
    left, top = offset
    width, height = img.size
    cols = _nearest_picks(width, new_w, left, size)
    rows = _nearest_picks(height, new_h, top, size)
    arr = np.asarray(img)
    out = np.zeros((size, size), dtype=arr.dtype)  # Pillow fills positions it cannot map
    valid_cols = np.flatnonzero(cols >= 0)
    if len(valid_cols):
        span = slice(int(valid_cols[0]), int(valid_cols[-1]) + 1)
        picked_cols = np.maximum(cols[span], 0)  # Pillow's table holds 0 where unmapped
        for i in np.flatnonzero(rows >= 0):
            out[i, span] = arr[rows[i], picked_cols]
    if img.mode == "1":
        return Image.fromarray(out)
    result = Image.frombytes(img.mode, (size, size), np.ascontiguousarray(out).tobytes())
    if img.palette is not None:
        palette_mode = img.palette.mode
        result.putpalette(img.getpalette(rawmode=palette_mode) or [], palette_mode)
    if "transparency" in img.info:
        result.info["transparency"] = img.info["transparency"]
    return result


#: Beyond this many steps the source coordinate is computed in closed form instead of Pillow's
#: running sum (a palette image of more than ~100,000,000:224 aspect); it may then pick the
#: neighbouring row at a rounding boundary.
_MAX_NEAREST_STEPS = 100_000_000


def _nearest_picks(in_size: int, out_size: int, first: int, count: int) -> npt.NDArray[np.int64]:
    """Source indices (-1: unmapped) for outputs ``first..+count`` of Pillow's nearest scaler.

    ``ImagingScaleAffine`` starts at ``step / 2`` and adds ``step`` per output, truncating; a
    running float64 sum (``np.cumsum`` is sequential) reproduces its rounding exactly.
    """
    step = float(in_size) / out_size
    if first + count > _MAX_NEAREST_STEPS:
        pos = (np.arange(first, first + count) + 0.5) * step
    else:
        carry = step * 0.5
        chunk = 1 << 20
        done = 0
        while done + chunk < first:  # advance the running sum to ``first`` in bounded memory
            seq = np.full(chunk + 1, step)
            seq[0] = carry
            carry = float(np.cumsum(seq)[-1])
            done += chunk
        seq = np.full(first - done + count, step)
        seq[0] = carry
        pos = np.cumsum(seq)[first - done :]
    picks = np.where(pos < 0.0, -1, np.trunc(pos)).astype(np.int64)
    return np.where(picks < in_size, picks, -1)


def _bands(img: Image.Image) -> npt.NDArray[np.uint8]:
    arr = np.asarray(img)
    return arr if arr.ndim == 3 else arr[:, :, None]


def _image_from(arr: npt.NDArray[np.uint8], mode: str) -> Image.Image:
    h, w = arr.shape[:2]
    return Image.frombytes(mode, (w, h), np.ascontiguousarray(arr).tobytes())
