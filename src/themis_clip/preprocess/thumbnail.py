"""Thumbnails and previews of indexed images: small JPEGs decoded under the same guards as an
embedding's decode (:func:`~themis_clip.preprocess.image.decode_image`)."""

from __future__ import annotations

import contextlib
import io

from PIL import Image

from themis_clip.budget import PixelBudget
from themis_clip.interface import ImageData
from themis_clip.preprocess.image import decode_image
from themis_clip.vocabulary import DEFAULT_MAX_IMAGE_PIXELS

__all__ = ["KEPT_PREVIEW", "fit_preview", "make_thumbnail"]

#: the longer side of the preview kept for an item added without a file: at least the largest
#: image input of a supported model (448 px), so a migration to another model re-embeds it at
#: full input resolution
KEPT_PREVIEW = 448

_NO_LEASE = contextlib.nullcontext()


def make_thumbnail(
    data: ImageData,
    *,
    size: int = 192,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    budget: PixelBudget | None = None,
) -> bytes:
    """A JPEG preview of ``data`` fitting in ``size``×``size`` (same decoding guards).

    JPEGs are decoded at the smallest DCT scale that still covers ``size``; the decode holds its
    pixels in ``budget`` (when given) like an embedding's decode does.
    """
    lease = budget.lease() if budget is not None else None
    with lease or _NO_LEASE:
        img = decode_image(
            data,
            max_image_pixels=max_image_pixels,
            draft_min_side=size,
            reserve=lease.take_bytes if lease is not None else None,
        )
        if img.mode in ("1", "P", "PA"):  # resized NEAREST otherwise
            img = img.convert("RGB")
        img.thumbnail((size, size), Image.Resampling.BICUBIC)
        if img.mode != "RGB":
            img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def fit_preview(
    stored: bytes,
    size: int,
    *,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    budget: PixelBudget | None = None,
) -> bytes:
    """``stored`` (a JPEG preview) as it is when it fits in ``size``×``size``, else reduced
    to fit: a thumbnail of a kept :data:`KEPT_PREVIEW` preview costs its own size only."""
    with Image.open(io.BytesIO(stored)) as img:
        if max(img.size) <= size:
            return stored
    return make_thumbnail(stored, size=size, max_image_pixels=max_image_pixels, budget=budget)
